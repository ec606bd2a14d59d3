// Batched decode in process on the lite-attn preset (DeepSeek-V2-Lite's
// attention dims): `--sequences` sequences holding `--context` tokens of
// int8 latents each step together through Model::Forward, on 1 kernel
// thread and on every core, in the same run. The thread pool splits the
// projections' weight rows and the sequences' attention. Where a GPU can be
// used, the same steps again with --device cuda (a row saying why not
// otherwise). The first step of each row is timed apart: it pays for what
// later steps reuse (on the GPU: copying every block to the device pool,
// loading kernels, allocating scratch, cuBLAS's first calls).
//
//   decode_bench [--sequences 8] [--context 2048] [--steps 10] [--cuda-only]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "kvtier/kernels/parallel.h"
#include "load/decode_steps.h"
#include "services/common/flags.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model.h"

namespace kvtier::runtime {
namespace {

int Main(int argc, char** argv) {
  uint64_t sequences = 8, context = 2048, steps = 10;
  bool cuda_only = false;
  FlagParser flags("decode_bench [--sequences N] [--context TOKENS] [--steps N] [--cuda-only]",
                   "Batched decode steps over long int8 contexts, 1 thread against every core.");
  flags.AddUint("sequences", &sequences, "sequences stepped together");
  flags.AddUint("context", &context, "tokens each sequence holds before the timed steps");
  flags.AddUint("steps", &steps, "timed decode steps after the first");
  flags.AddBool("cuda-only", &cuda_only, "the cuda row alone (the caches prefilled on the GPU too)");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "decode_bench")) {
    return *exit;
  }
  steps = std::max<uint64_t>(steps, 1);
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvtier_decode_bench_" + std::to_string(getpid()));
  if (!MakeModel(*PresetConfig("lite-attn"), dir.string(), 3).ok()) return 1;
  auto checkpoint = Checkpoint::Open(dir.string());
  auto model = Model::Load(**checkpoint);
  auto on_gpu = Model::Load(**checkpoint, Device::kCuda);
  std::filesystem::remove_all(dir);
  if (!model.ok()) return 1;
  const Model& m = **model;
  if (cuda_only && !on_gpu.ok()) {
    std::printf("%-14s not run: %s\n", "cuda", std::string(on_gpu.status().message()).c_str());
    return 0;
  }
  kernels::SetKernelThreads(cores);
  std::mt19937 rng(1);
  std::vector<SequenceCache> caches;
  std::vector<std::vector<float>> logits(sequences, std::vector<float>(m.config().vocab_size));
  for (size_t b = 0; b < sequences; ++b) {
    std::vector<uint32_t> prompt(context);
    for (uint32_t& t : prompt) t = rng() % m.config().vocab_size;
    caches.push_back(m.NewCache(kernels::Codec::kInt8, 64));
    const Model& prefill = cuda_only ? **on_gpu : m;  // on_gpu is ok: checked above
    if (!prefill.Prefill(prompt, caches.back(), logits[b]).ok()) return 1;
  }
  std::printf("%zu sequences x %zu-token int8 contexts, lite-attn, %zu steps\n", sequences, context, steps);
  std::printf("%-14s %14s %12s %10s\n", "device", "first step ms", "ms/step", "tok/s");
  // Steps `model` over copies of the prefilled caches: one step, then the
  // timed ones.
  auto time_steps = [&](const Model& model, const std::string& name) {
    std::vector<SequenceCache> stepped = caches;
    absl::StatusOr<double> first = load::TimeDecodeSteps(model, stepped, 1);
    absl::StatusOr<double> seconds = first.ok() ? load::TimeDecodeSteps(model, stepped, steps) : first;
    if (!seconds.ok()) {
      std::printf("%-14s failed: %s\n", name.c_str(), std::string(seconds.status().message()).c_str());
      return false;
    }
    std::printf("%-14s %14.1f %12.2f %10.1f\n", name.c_str(), *first * 1e3, *seconds / steps * 1e3,
                sequences * steps / *seconds);
    return true;
  };
  for (size_t threads : {size_t{1}, cores}) {
    if (cuda_only) break;
    kernels::SetKernelThreads(threads);
    if (!time_steps(m, "cpu, " + std::to_string(threads) + (threads == 1 ? " thread" : " threads"))) return 1;
  }
  if (!on_gpu.ok()) {
    std::printf("%-14s not run: %s\n", "cuda", std::string(on_gpu.status().message()).c_str());
    return 0;
  }
  return time_steps(**on_gpu, "cuda") ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::runtime

int main(int argc, char** argv) { return kvtier::runtime::Main(argc, argv); }
