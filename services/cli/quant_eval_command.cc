// `kvtier quant-eval`: the seeds' quantization comparison on a file of
// latents or on synthetic ones.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/base/flags.h"
#include "services/base/status.h"
#include "services/cli/commands.h"
#include "services/cli/quant_eval.h"

namespace kvtier::cli {
namespace {

// Keeps --synthetic within a few hundred MiB.
constexpr uint64_t kMaxSyntheticTokens = 262144;

struct Options {
  std::string input;
  bool synthetic = false;
  uint64_t dim = 576;
  uint64_t rope_dim = 64;
  uint64_t tokens_per_block = 64;
  std::string codec = "int8";
  bool json = false;
  uint64_t tokens = 4096;
  uint64_t seed = 1;
};

absl::StatusOr<LatentRows> ReadLatents(const std::string& path, uint32_t latent_dim, uint32_t rope_dim) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return absl::NotFoundError(absl::StrCat("cannot open --input ", path, ": not a regular file"));
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open --input ", path));
  LatentRows rows;
  rows.latent_dim = latent_dim;
  rows.rope_dim = rope_dim;
  const size_t bytes = static_cast<size_t>(in.tellg());
  const size_t row_bytes = size_t{rows.dim()} * sizeof(float);
  if (bytes == 0 || bytes % row_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is ", bytes, " bytes, not a positive multiple of a row (",
                                                   rows.dim(), " float32 = ", row_bytes, " bytes)"));
  }
  rows.values.resize(bytes / sizeof(float));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(rows.values.data()), static_cast<std::streamsize>(bytes))) {
    return absl::DataLossError(absl::StrCat("error reading ", path));
  }
  return rows;
}

std::string JsonNumber(double v) { return absl::StrFormat("%.9g", v); }

absl::Status Run(const Options& o) {
  const std::optional<kernels::Codec> codec = kernels::ParseCodec(o.codec);
  if (!codec) {
    return absl::InvalidArgumentError(absl::StrCat("--codec ", o.codec, " is not one of bf16, fp8, int8, int4"));
  }
  if (o.synthetic == !o.input.empty()) {
    return absl::InvalidArgumentError("give exactly one of --input FILE and --synthetic");
  }
  if (o.rope_dim >= o.dim || o.dim - o.rope_dim > kernels::kMaxLatentDim || o.rope_dim > kernels::kMaxLatentDim) {
    return absl::InvalidArgumentError(absl::StrCat("--dim ", o.dim, " and --rope-dim ", o.rope_dim, " must leave 1..",
                                                   kernels::kMaxLatentDim, " latent dims"));
  }
  if (o.tokens_per_block < 1 || o.tokens_per_block > kernels::kMaxBlockTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens-per-block ", o.tokens_per_block, " outside 1..", kernels::kMaxBlockTokens));
  }
  const uint32_t latent_dim = static_cast<uint32_t>(o.dim - o.rope_dim);
  const uint32_t rope_dim = static_cast<uint32_t>(o.rope_dim);
  LatentRows rows;
  std::string source;
  if (o.synthetic) {
    if (o.tokens < 1 || o.tokens > kMaxSyntheticTokens) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens must be in 1..", kMaxSyntheticTokens));
    }
    rows = MakeSyntheticLatents(static_cast<uint32_t>(o.tokens), latent_dim, rope_dim, o.seed);
    source = absl::StrCat("synthetic latents with outlier channels (seed ", o.seed, ")");
  } else {
    KVTIER_ASSIGN_OR_RETURN(rows, ReadLatents(o.input, latent_dim, rope_dim));
    source = o.input;
  }
  const uint32_t tpb = static_cast<uint32_t>(o.tokens_per_block);

  if (o.json) {
    KVTIER_ASSIGN_OR_RETURN(SchemeResult r, EvaluateCodec(*codec, rows, tpb));
    std::cout << "{\"codec\": \"" << kernels::CodecName(*codec)
              << "\", \"bytes_per_token\": " << JsonNumber(r.bytes_per_token)
              << ", \"latent_rel_error\": " << JsonNumber(r.latent_rel_error)
              << ", \"rope_rel_error\": " << JsonNumber(r.rope_rel_error) << "}\n";
    return absl::OkStatus();
  }

  KVTIER_ASSIGN_OR_RETURN(std::vector<SchemeResult> table, EvaluateAllSchemes(rows, tpb));
  std::cout << absl::StrFormat("%zu tokens x (%u latent + %u rope), blocks of %u tokens, %s\n", rows.tokens(),
                               latent_dim, rope_dim, tpb, source);
  std::cout << "errors: mean over tokens of ||x - x'|| / ||x||; bytes per token per layer, "
               "scales included\n\n";
  std::cout << absl::StrFormat("%-44s %12s %16s %14s\n", "scheme", "bytes/token", "latent rel err", "rope rel err");
  const SchemeResult* chosen = nullptr;
  for (const SchemeResult& r : table) {
    const bool is_chosen = r.codec == codec;
    if (is_chosen) chosen = &r;
    std::cout << absl::StrFormat("%-44s %12.1f %16.6f %14.6f%s\n", r.scheme, r.bytes_per_token, r.latent_rel_error,
                                 r.rope_rel_error, is_chosen ? "  <-" : "");
  }
  std::cout << absl::StrFormat("\ncodec %s: %.1f bytes/token/layer, latent rel error %.6f, rope rel error %.6f\n",
                               kernels::CodecName(*codec), chosen->bytes_per_token, chosen->latent_rel_error,
                               chosen->rope_rel_error);
  return absl::OkStatus();
}

}  // namespace

int RunQuantEval(const std::vector<std::string>& args) {
  Options o;
  FlagParser flags("kvtier quant-eval (--input FILE --dim N | --synthetic) [--codec C] [flags]",
                   "Measures how each quantization scheme distorts MLA latents: kvtier's four codecs\n"
                   "and the seeds' baselines side by side on the same data. FILE holds raw\n"
                   "little-endian float32 rows [tokens, dim], rope dims last. Prints the mean over\n"
                   "tokens of ||x - x'||/||x|| for latent and rope dims and bytes per token per layer.");
  flags.AddString("input", &o.input, "file of float32 rows [tokens, dim]");
  flags.AddBool("synthetic", &o.synthetic, "use generated latents with outlier channels");
  flags.AddUint("dim", &o.dim, "values per row, latent + rope");
  flags.AddUint("rope-dim", &o.rope_dim, "rope dims at the end of each row");
  flags.AddUint("tokens-per-block", &o.tokens_per_block, "tokens sharing per-channel scales");
  flags.AddString("codec", &o.codec, "bf16|fp8|int8|int4, the codec reported last and in --json");
  flags.AddBool("json", &o.json, "print one JSON object {codec, bytes_per_token, latent_rel_error, rope_rel_error}");
  flags.AddUint("tokens", &o.tokens, "tokens to generate with --synthetic");
  flags.AddUint("seed", &o.seed, "random seed for --synthetic");
  if (std::optional<int> exit = flags.ParseOrExit(args, "kvtier quant-eval")) return *exit;
  if (absl::Status s = Run(o); !s.ok()) {
    std::cerr << "kvtier quant-eval: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace kvtier::cli
