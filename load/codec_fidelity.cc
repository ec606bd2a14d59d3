// How much each latent codec changes the model's output: teacher-forced
// prompts of random ids, logits at every position under fp8/int8/int4 latent
// blocks compared with the same run under bf16 blocks.
//
//   codec_fidelity --preset tiny --prompts 32 --tokens 256
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "services/common/flags.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model.h"

namespace kvtier::runtime {
namespace {

int Run(const std::string& preset, int prompts, int tokens, uint32_t tokens_per_block) {
  const auto dir = std::filesystem::temp_directory_path() / ("kvtier_fidelity_" + preset);
  absl::StatusOr<ModelConfig> config = PresetConfig(preset);
  if (!config.ok() || !MakeModel(*config, dir.string(), 1).ok()) return 1;
  auto ckpt = Checkpoint::Open(dir.string());
  auto model = Model::Load(**ckpt);
  if (!model.ok()) return 1;
  const kernels::Codec codecs[] = {kernels::Codec::kFp8, kernels::Codec::kInt8, kernels::Codec::kInt4};
  struct Tally {
    double rel_error_sum = 0, rel_error_max = 0;
    long agree = 0, positions = 0;
  } tally[3];
  std::mt19937_64 rng(2026);
  std::uniform_int_distribution<uint32_t> id(0, static_cast<uint32_t>(config->vocab_size - 1));
  const auto start = std::chrono::steady_clock::now();
  for (int p = 0; p < prompts; ++p) {
    std::vector<uint32_t> prompt(tokens);
    for (auto& t : prompt) t = id(rng);
    SequenceCache base = (*model)->NewCache(kernels::Codec::kBf16, tokens_per_block);
    std::vector<SequenceCache> caches;
    for (kernels::Codec c : codecs) caches.push_back((*model)->NewCache(c, tokens_per_block));
    std::vector<float> want(config->vocab_size), got(config->vocab_size);
    for (int t = 0; t < tokens; ++t) {
      if (!(*model)->Step(prompt[t], base, want).ok()) return 1;
      const size_t argmax = std::max_element(want.begin(), want.end()) - want.begin();
      double mag = 0;
      for (float v : want) mag = std::max(mag, std::fabs(double{v}));
      for (int c = 0; c < 3; ++c) {
        if (!(*model)->Step(prompt[t], caches[c], got).ok()) return 1;
        // Positions before the first sealed block see no quantized latents.
        if (t < static_cast<int>(tokens_per_block)) continue;
        double diff = 0;
        for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, std::fabs(double{got[i]} - want[i]));
        Tally& y = tally[c];
        y.rel_error_sum += diff / mag;
        y.rel_error_max = std::max(y.rel_error_max, diff / mag);
        y.agree += static_cast<size_t>(std::max_element(got.begin(), got.end()) - got.begin()) == argmax;
        ++y.positions;
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("preset %s: %d prompts x %d tokens, blocks of %u, positions after the first block; vs bf16 blocks\n\n",
              preset.c_str(), prompts, tokens, tokens_per_block);
  std::printf("%-6s %22s %22s %18s\n", "codec", "mean max|dlogit|/max|logit|", "worst", "greedy agreement");
  for (int c = 0; c < 3; ++c) {
    const Tally& y = tally[c];
    std::printf("%-6s %22.5f %22.5f %17.2f%%\n", kernels::CodecName(codecs[c]), y.rel_error_sum / y.positions,
                y.rel_error_max, 100.0 * y.agree / y.positions);
  }
  std::printf("\n(%.1f s)\n", seconds);
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace kvtier::runtime

int main(int argc, char** argv) {
  std::string preset = "tiny";
  uint64_t prompts = 32, tokens = 256, block = 64;
  kvtier::FlagParser flags("codec_fidelity [--preset tiny|lite-attn] [--prompts N] [--tokens N]",
                           "Logit error and greedy agreement of fp8/int8/int4 latent blocks vs bf16.");
  flags.AddString("preset", &preset, "generated model to use");
  flags.AddUint("prompts", &prompts, "random prompts");
  flags.AddUint("tokens", &tokens, "tokens per prompt (teacher-forced)");
  flags.AddUint("tokens-per-block", &block, "latent block size");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "codec_fidelity")) {
    return *exit;
  }
  return kvtier::runtime::Run(preset, static_cast<int>(prompts), static_cast<int>(tokens),
                              static_cast<uint32_t>(block));
}
