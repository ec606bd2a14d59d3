// `kvtier run`: in-process generation on a checkpoint, no servers (for
// checking a model). Last stdout line: the generated ids; or, with --json,
// one JSON object with ids, logprobs and top logprobs.
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/cli/commands.h"
#include "services/common/flags.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/generate.h"

namespace kvtier::cli {
namespace {

absl::StatusOr<std::vector<uint32_t>> ParseIds(const std::string& text) {
  std::vector<uint32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    uint32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--prompt-ids: '", std::string(part), "' is not a token id"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--prompt-ids is empty");
  return ids;
}

absl::Status ParseFloat(const std::string& flag, const std::string& text, float& out) {
  if (text.empty()) return absl::OkStatus();
  if (!absl::SimpleAtof(text, &out)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " wants a number, got '", text, "'"));
  }
  return absl::OkStatus();
}

std::string Json(const std::vector<runtime::Sampled>& out, size_t prompt_tokens) {
  std::vector<std::string> ids, logprobs, tops;
  for (const runtime::Sampled& s : out) {
    ids.push_back(absl::StrCat(s.token));
    logprobs.push_back(absl::StrFormat("%.9g", s.logprob));
    std::vector<std::string> pairs;
    for (const auto& [id, lp] : s.top) pairs.push_back(absl::StrFormat("[%u, %.9g]", id, lp));
    tops.push_back(absl::StrCat("[", absl::StrJoin(pairs, ", "), "]"));
  }
  return absl::StrCat("{\"ids\": [", absl::StrJoin(ids, ", "), "], \"logprobs\": [",
                      absl::StrJoin(logprobs, ", "), "], \"top_logprobs\": [", absl::StrJoin(tops, ", "),
                      "], \"prompt_tokens\": ", prompt_tokens, ", \"cached_tokens\": 0}");
}

absl::Status Run(const std::string& model_dir, const std::string& prompt_ids, uint64_t max_new,
                 const std::string& codec_name, uint64_t tokens_per_block, bool json,
                 const runtime::Sampling& sampling) {
  if (model_dir.empty()) return absl::InvalidArgumentError("--model is required");
  const std::optional<kernels::Codec> codec = kernels::ParseCodec(codec_name);
  if (!codec) return absl::InvalidArgumentError(absl::StrCat("--kv-codec ", codec_name, " is not one of bf16, fp8, int8, int4"));
  if (max_new < 1 || max_new > 1 << 20) return absl::InvalidArgumentError("--max-new-tokens must be in 1..1048576");
  if (tokens_per_block < 1 || tokens_per_block > kernels::kMaxBlockTokens) {
    return absl::InvalidArgumentError("--tokens-per-block must be in 1..4096");
  }
  auto prompt = ParseIds(prompt_ids);
  if (!prompt.ok()) return prompt.status();
  auto ckpt = runtime::Checkpoint::Open(model_dir);
  if (!ckpt.ok()) return ckpt.status();
  auto model = runtime::Model::Load(**ckpt);
  if (!model.ok()) return model.status();
  runtime::GenerateOptions options;
  options.max_new_tokens = static_cast<uint32_t>(max_new);
  options.codec = *codec;
  options.tokens_per_block = static_cast<uint32_t>(tokens_per_block);
  options.sampling = sampling;
  auto out = runtime::Generate(**model, *prompt, options);
  if (!out.ok()) return out.status();
  if (json) {
    std::cout << Json(*out, prompt->size()) << "\n";
  } else {
    std::vector<std::string> ids;
    for (const auto& s : *out) ids.push_back(absl::StrCat(s.token));
    std::cout << absl::StrJoin(ids, " ") << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

int RunRun(const std::vector<std::string>& args) {
  std::string model, prompt_ids, codec = "bf16", temperature, top_p;
  uint64_t max_new = 16, tokens_per_block = 64, seed = 0;
  bool json = false;
  FlagParser flags("kvtier run --model DIR --prompt-ids 1,2,3 --max-new-tokens N [flags]",
                   "Generates in process on a DeepSeek-V2 checkpoint (no servers), with absorbed\n"
                   "MLA over latents stored in --kv-codec. Greedy unless --temperature is given.");
  flags.AddString("model", &model, "checkpoint directory (config.json + safetensors)");
  flags.AddString("prompt-ids", &prompt_ids, "comma-separated prompt token ids");
  flags.AddUint("max-new-tokens", &max_new, "tokens to generate");
  flags.AddString("kv-codec", &codec, "bf16|fp8|int8|int4: how full latent blocks are stored");
  flags.AddUint("tokens-per-block", &tokens_per_block, "tokens per latent block");
  flags.AddBool("json", &json, "print {ids, logprobs, top_logprobs, prompt_tokens, cached_tokens}");
  flags.AddString("temperature", &temperature, "sampling temperature (0 or empty: greedy)");
  flags.AddString("top-p", &top_p, "nucleus sampling mass in (0, 1]");
  flags.AddUint("seed", &seed, "sampling seed");
  if (std::optional<int> exit = flags.ParseOrExit(args, "kvtier run")) return *exit;
  runtime::Sampling sampling;
  sampling.seed = seed;
  absl::Status s = ParseFloat("temperature", temperature, sampling.temperature);
  if (s.ok()) s = ParseFloat("top-p", top_p, sampling.top_p);
  if (s.ok()) s = Run(model, prompt_ids, max_new, codec, tokens_per_block, json, sampling);
  if (!s.ok()) {
    std::cerr << "kvtier run: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace kvtier::cli
