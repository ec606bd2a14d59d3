// What each latent codec costs a trained model on text it never saw:
// teacher-forced perplexity, KL divergence from the float model's next-token
// distributions and top-1 agreement, with the latents of every earlier token
// held as the cache holds them (full blocks in the codec, the tail in
// float); in process over the whole text, and through the real services
// (kvtier-cache, kvtier-decode, one kvtier-prefill per codec) over its first
// --served-positions positions, where every full block comes from the cache.
//
//   codec_fidelity                       (the trained model, its held-out text)
//   codec_fidelity --tokens 4096 --served-positions 0
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvtier/kernels/parallel.h"
#include "load/fidelity/teacher_forced.h"
#include "load/serve_target.h"
#include "services/base/child_process.h"
#include "services/base/flags.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/tokenizer.h"

namespace kvtier::fidelity {
namespace {

constexpr kernels::Codec kCodecs[] = {kernels::Codec::kBf16, kernels::Codec::kFp8, kernels::Codec::kInt8,
                                      kernels::Codec::kInt4};

struct Flags {
  std::string model = KVTIER_MODELS_DIR "/jargon-mla";
  std::string text;            // default: the model's heldout.txt
  uint64_t tokens = 0;         // 0: the whole text
  uint64_t random_tokens = 0;  // > 0: score this many seeded random ids instead of text
  uint64_t window = 512;
  uint64_t tokens_per_block = 64;
  uint64_t served_positions = 1024;
  std::string bin = "build/services";
  uint64_t threads = 2;
  bool json = false;
};

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "codec_fidelity: %s\n", message.c_str());
  std::exit(1);
}

// The services on `model`: one cache, one decode worker, a prefill node per
// codec that answers every token's logprob. Scores per codec, in kCodecs'
// order; `float_scores`, the float model's over the same positions.
std::vector<Scores> ScoreThroughServices(const Flags& f, const Windows& text, uint32_t vocab,
                                         const std::vector<std::vector<float>>& kept, Scores& float_scores,
                                         double& seconds) {
  const auto start = std::chrono::steady_clock::now();
  ChildProcess cache({f.bin + "/kvtier-cache", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--device-capacity",
                      "1GiB", "--host-capacity", "64MiB"});
  const std::string cache_target = load::ServeTarget(cache, "kvtier-cache");
  ChildProcess decode({f.bin + "/kvtier-decode", "--listen", "127.0.0.1:0", "--model", f.model, "--cache", cache_target,
                       "--threads", "1"});
  const std::string decode_target = load::ServeTarget(decode, "kvtier-decode");
  std::vector<Scores> out;
  for (size_t c = 0; c < std::size(kCodecs); ++c) {
    const std::string codec = kernels::CodecName(kCodecs[c]);
    ChildProcess prefill({f.bin + "/kvtier-prefill", "--listen", "127.0.0.1:0", "--model", f.model, "--cache",
                          cache_target, "--decode", decode_target, "--kv-codec", codec, "--tokens-per-block",
                          std::to_string(f.tokens_per_block), "--max-top-logprobs", std::to_string(vocab), "--threads",
                          std::to_string(f.threads)});
    uint64_t cached = 0;
    absl::StatusOr<Scores> s =
        ScoreServed(load::ServeTarget(prefill, "kvtier-prefill --kv-codec " + codec), text, f.served_positions, vocab,
                    kept[0], kept[c + 1], &cached, c == 0 ? &float_scores : nullptr);
    if (!s.ok()) Fail(absl::StrCat(codec, " through the services: ", s.status().ToString()));
    if (f.served_positions >= 2 * f.tokens_per_block && cached == 0) Fail(codec + ": no block came from the cache");
    s->name = codec;
    out.push_back(*s);
    prefill.Stop(SIGTERM);
  }
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

int Main(const Flags& f) {
  kernels::SetKernelThreads(static_cast<int>(std::max<uint64_t>(1, f.threads)));
  absl::StatusOr<std::unique_ptr<runtime::Checkpoint>> ckpt = runtime::Checkpoint::Open(f.model);
  if (!ckpt.ok()) Fail(ckpt.status().ToString());
  const runtime::ModelConfig config = (*ckpt)->config();
  absl::StatusOr<std::unique_ptr<runtime::Model>> model = runtime::Model::Load(**ckpt);
  if (!model.ok()) Fail(model.status().ToString());
  std::string text_path = f.text.empty() ? f.model + "/heldout.txt" : f.text;
  std::vector<uint32_t> ids;
  if (f.random_tokens > 0) {
    // A checkpoint without a tokenizer (make-model's): random ids, on which
    // perplexity means nothing but KL and top-1 still measure the codecs.
    text_path = absl::StrCat(f.random_tokens, " random ids");
    std::mt19937_64 rng(1);
    std::uniform_int_distribution<uint32_t> id(0, static_cast<uint32_t>(config.vocab_size - 1));
    for (uint64_t i = 0; i < f.random_tokens; ++i) ids.push_back(id(rng));
  } else {
    absl::StatusOr<runtime::ByteTokenizer> tokenizer =
        runtime::ByteTokenizer::ForClass((*ckpt)->tokenizer_class(), config.vocab_size);
    if (!tokenizer.ok()) Fail(tokenizer.status().ToString() + " (--random-tokens scores random ids instead)");
    std::ifstream in(text_path, std::ios::binary);
    if (!in) Fail("cannot read " + text_path);
    std::stringstream bytes;
    bytes << in.rdbuf();
    ids = tokenizer->Encode(bytes.str());
  }
  if (f.tokens > 0 && ids.size() > f.tokens) ids.resize(f.tokens);
  if (f.window < 2 || f.window > static_cast<uint64_t>(config.max_position_embeddings)) {
    Fail(absl::StrCat("--window must be in 2..", config.max_position_embeddings, " (the model's positions)"));
  }
  if (f.tokens_per_block < 1 || f.tokens_per_block > kernels::kMaxBlockTokens) {
    Fail(absl::StrCat("--tokens-per-block must be in 1..", kernels::kMaxBlockTokens));
  }
  const Windows text{ids, f.window};
  const uint32_t vocab = static_cast<uint32_t>(config.vocab_size);
  const size_t served = std::min<size_t>(f.served_positions, text.positions());

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> kept;
  absl::StatusOr<std::vector<Scores>> local =
      ScoreInProcess(**model, text, static_cast<uint32_t>(f.tokens_per_block), kCodecs, served, &kept);
  if (!local.ok()) Fail(local.status().ToString());
  const double local_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double served_seconds = 0;
  std::vector<Scores> remote;
  Scores float_head;  // the float model over the served positions
  if (served > 0) remote = ScoreThroughServices(f, text, vocab, kept, float_head, served_seconds);

  const double float_ppl = (*local)[0].Perplexity();
  const kernels::BlockShape shape{static_cast<uint32_t>(f.tokens_per_block), static_cast<uint32_t>(config.kv_lora_rank),
                                  static_cast<uint32_t>(config.qk_rope_head_dim)};
  if (f.json) {
    nlohmann::json out = {{"model", f.model},
                          {"text", text_path},
                          {"positions", text.positions()},
                          {"served_positions", served},
                          {"runs", nlohmann::json::array()}};
    const auto measures = [](const Scores& s) {
      return nlohmann::json{
          {"perplexity", s.Perplexity()}, {"mean_kl", s.MeanKl()}, {"top1_agreement", s.Top1Agreement()}};
    };
    for (size_t r = 0; r < local->size(); ++r) {
      nlohmann::json run = measures((*local)[r]);
      run["codec"] = (*local)[r].name;
      if (r > 0 && !remote.empty()) {
        run["served"] = measures(remote[r - 1]);
        run["served"]["max_logprob_difference"] = remote[r - 1].max_logprob_difference;
      }
      out["runs"].push_back(run);
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%s on %s: %zu tokens in windows of %llu, %zu positions; blocks of %llu tokens\n", f.model.c_str(),
              text_path.c_str(), ids.size(), static_cast<unsigned long long>(f.window), text.positions(),
              static_cast<unsigned long long>(f.tokens_per_block));
  std::printf("in process (%.0f s): every position\n\n", local_seconds);
  std::printf("%-6s %14s %11s %10s %14s %8s\n", "codec", "B/token/layer", "perplexity", "vs float", "mean KL (nats)",
              "top-1");
  for (size_t r = 0; r < local->size(); ++r) {
    const Scores& s = (*local)[r];
    const std::string bytes_per_token =
        r == 0 ? absl::StrFormat("%.0f", 4.0 * (shape.latent_dim + shape.rope_dim))
               : absl::StrFormat("%.1f", static_cast<double>(kernels::EncodedBytes(kCodecs[r - 1], shape)) /
                                             static_cast<double>(shape.tokens));
    std::printf("%-6s %14s %11.4f %+9.3f%% %14.2e %7.2f%%\n", s.name.c_str(), bytes_per_token.c_str(), s.Perplexity(),
                100.0 * (s.Perplexity() / float_ppl - 1.0), s.MeanKl(), 100.0 * s.Top1Agreement());
  }
  if (!remote.empty()) {
    std::printf("\nthrough the services (%.0f s): the first %zu positions, blocks from the cache\n\n", served_seconds,
                served);
    std::printf("%-6s %11s %10s %14s %8s %22s\n", "codec", "perplexity", "vs float", "mean KL (nats)", "top-1",
                "max |dlogprob| vs local");
    for (const Scores& v : remote) {
      std::printf("%-6s %11.4f %+9.3f%% %14.2e %7.2f%% %22.2e\n", v.name.c_str(), v.Perplexity(),
                  100.0 * (v.Perplexity() / float_head.Perplexity() - 1.0), v.MeanKl(), 100.0 * v.Top1Agreement(),
                  v.max_logprob_difference);
    }
    std::printf("float  %11.4f (in process, same positions)\n", float_head.Perplexity());
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::fidelity

int main(int argc, char** argv) {
  kvtier::fidelity::Flags f;
  kvtier::FlagParser flags("codec_fidelity [--model DIR] [--text FILE] [flags]",
                           "Perplexity, KL from the float model and top-1 agreement per latent codec, on\n"
                           "held-out text, in process and through the services (see load/README.md).");
  flags.AddString("model", &f.model,
                  "checkpoint, with a byte tokenizer unless --random-tokens is given (default: the trained model)");
  flags.AddString("text", &f.text, "UTF-8 text to score (default: the model's heldout.txt)");
  flags.AddUint("tokens", &f.tokens, "score the text's first N tokens (0: all)");
  flags.AddUint("random-tokens", &f.random_tokens,
                "score N seeded random ids instead of text (a checkpoint without a tokenizer, such as make-model's "
                "presets: perplexity means nothing there, KL and top-1 still measure the codecs)");
  flags.AddUint("window", &f.window, "tokens per teacher-forced sequence (the model's training context)");
  flags.AddUint("tokens-per-block", &f.tokens_per_block, "latent block size");
  flags.AddUint("served-positions", &f.served_positions,
                "positions scored through the services too (0: none; each is one Generate)");
  flags.AddString("bin-dir", &f.bin, "directory of kvtier-cache, kvtier-decode, kvtier-prefill");
  flags.AddUint("threads", &f.threads, "threads for the model's matrix products");
  flags.AddBool("json", &f.json, "print one JSON object instead of the tables");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "codec_fidelity")) {
    return *exit;
  }
  return kvtier::fidelity::Main(f);
}
