// `kvtier make-model --preset tiny|lite-attn|v3-tiny|kimi-k2-tiny|v32-tiny|v4-tiny
// --out DIR [--seed N]`: writes a random, seeded DeepSeek-V2, V3-family or
// V4 checkpoint, as the model's authors publish it.
#include <chrono>
#include <iostream>

#include "services/base/flags.h"
#include "services/cli/commands.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model_tensors.h"

namespace kvtier::cli {

int RunMakeModel(const std::vector<std::string>& args) {
  std::string preset, out;
  uint64_t seed = 1, shards = 0;
  FlagParser flags(
      "kvtier make-model --preset tiny|lite-attn|v3-tiny|kimi-k2-tiny|v32-tiny|v4-tiny|v4-tiny-fp8 --out DIR "
      "[--seed N]",
      "Writes a random checkpoint in Hugging Face format, as the model's authors\n"
      "publish it. DeepSeek-V2 (config.json + bf16 safetensors): tiny, small in\n"
      "every dimension; lite-attn, DeepSeek-V2-Lite's attention dims with 2 layers\n"
      "and a small MoE. The V3 family (FP8 projections with 128 x 128 block scales,\n"
      "the noaux_tc sigmoid router, 3 shards): v3-tiny, DeepSeek-V3's config at\n"
      "small dims with an MTP layer; kimi-k2-tiny, Kimi-K2's; v32-tiny, DeepSeek-V3.2's\n"
      "(v3-tiny with a lightning indexer, index_topk 8).\n"
      "DeepSeek-V4 (DeepSeek's own tensor names, bf16, 1 file): v4-tiny, window-only,\n"
      "CSA and HCA layers with a 16-token window and HCA ratio 8;\n"
      "v4-tiny-fp8, the same as V4 is released: FP8 projections, MXFP4 experts.");
  flags.AddString("preset", &preset, "tiny, lite-attn, v3-tiny, kimi-k2-tiny, v32-tiny, v4-tiny or v4-tiny-fp8");
  flags.AddString("out", &out, "directory to write (created if needed)");
  flags.AddUint("seed", &seed, "random seed; equal seeds give equal files");
  flags.AddUint("shards", &shards,
                "safetensors files, with an index when more than 1 (default: as published, 1 for V2 and V4, 3 for V3)");
  if (std::optional<int> exit = flags.ParseOrExit(args, "kvtier make-model")) return *exit;
  if (preset.empty() || out.empty()) {
    std::cerr << "kvtier make-model: --preset and --out are required (see --help)\n";
    return 2;
  }
  absl::StatusOr<runtime::ModelConfig> config = runtime::PresetConfig(preset);
  if (!config.ok()) {
    std::cerr << "kvtier make-model: --preset: " << config.status().message() << "\n";
    return 2;
  }
  if (shards == 0) shards = static_cast<uint64_t>(runtime::PublishedShards(*config));
  if (shards > 64) {
    std::cerr << "kvtier make-model: --shards must be 1..64\n";
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
