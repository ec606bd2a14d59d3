// `kvtier make-model --preset tiny|lite-attn --out DIR [--seed N]`: writes a
// random, seeded DeepSeek-V2 checkpoint in Hugging Face format.
#include <chrono>
#include <iostream>

#include "services/cli/commands.h"
#include "services/common/flags.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/make_model.h"

namespace kvtier::cli {

int RunMakeModel(const std::vector<std::string>& args) {
  std::string preset, out;
  uint64_t seed = 1, shards = 1;
  FlagParser flags("kvtier make-model --preset tiny|lite-attn --out DIR [--seed N]",
                   "Writes a random DeepSeek-V2 checkpoint (config.json + bf16 safetensors) in\n"
                   "Hugging Face format. tiny: small in every dimension; lite-attn:\n"
                   "DeepSeek-V2-Lite's attention dims with 2 layers and a small MoE.");
  flags.AddString("preset", &preset, "tiny or lite-attn");
  flags.AddString("out", &out, "directory to write (created if needed)");
  flags.AddUint("seed", &seed, "random seed; equal seeds give equal files");
  flags.AddUint("shards", &shards, "safetensors files, with an index when more than 1");
  if (std::optional<int> exit = flags.ParseOrExit(args, "kvtier make-model")) return *exit;
  if (out.empty() || shards < 1 || shards > 64) {
    std::cerr << "kvtier make-model: --out is required and --shards must be 1..64\n";
    return 2;
  }
  absl::StatusOr<runtime::ModelConfig> config = runtime::PresetConfig(preset);
  if (!config.ok()) {
    std::cerr << "kvtier make-model: --preset: " << config.status().message() << "\n";
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = runtime::MakeModel(*config, out, seed, static_cast<int>(shards)); !s.ok()) {
    std::cerr << "kvtier make-model: " << s.message() << "\n";
    return 1;
  }
  // Read it back: what was written must load.
  absl::StatusOr<std::unique_ptr<runtime::Checkpoint>> ckpt = runtime::Checkpoint::Open(out);
  if (!ckpt.ok()) {
    std::cerr << "kvtier make-model: wrote a checkpoint that does not load: " << ckpt.status() << "\n";
    return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "wrote " << preset << " (seed " << seed << ", " << runtime::ExpectedTensors(*config).size()
            << " tensors) to " << out << " in " << seconds << " s\n";
  return 0;
}

}  // namespace kvtier::cli
