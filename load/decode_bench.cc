// Batched decode in process on the lite-attn preset (DeepSeek-V2-Lite's
// attention dims): for each `--sequences` count, that many sequences
// holding `--context` tokens of int8 latents each step together through
// Model::Forward, on 1 kernel thread and on every core, in the same run.
// The thread pool splits the projections' weight rows and the sequences'
// attention. Where a GPU can be used, the same steps again with --device
// cuda (a row saying why not otherwise). The first step of each row is
// timed apart: it pays for what later steps reuse (on the GPU: copying
// every block to the device pool, loading kernels, allocating scratch,
// cuBLAS's first calls). Each steady step is set against its memory
// roofline: the bytes it must read (load/decode_roofline.h) at its
// device's copy rate, measured in the same run.
//
//   decode_bench [--sequences 8[,64...]] [--context 2048] [--steps 10] [--cuda-only]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kvtier/kernels/parallel.h"
#include "load/decode_roofline.h"
#include "load/decode_steps.h"
#include "services/common/flags.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model.h"
#ifdef KVTIER_RUNTIME_CUDA
#include "kvtier/kernels/cuda_device.h"
#endif

namespace kvtier::runtime {
namespace {

constexpr kernels::Codec kCodec = kernels::Codec::kInt8;
constexpr uint32_t kTokensPerBlock = 64;

template <typename Op>
double Seconds(Op op) {
  const auto start = std::chrono::steady_clock::now();
  op();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// memcpy split over the kernel threads, the best of 5 after a first, in
// GB/s of bytes read plus written (as kernels::cuda::DeviceCopyGBs counts).
// The best: the rate the machine can give, which a shared machine's noise
// only lowers.
double HostCopyGBs() {
  constexpr size_t kBytes = size_t{256} << 20;
  std::vector<char> from(kBytes, 1), to(kBytes);  // both touched: no page faults in the timing
  auto copy = [&] {
    kernels::ParallelFor(kBytes, size_t{1} << 20,
                         [&](size_t begin, size_t end) { std::memcpy(&to[begin], &from[begin], end - begin); });
  };
  copy();
  double best = 0;
  for (int i = 0; i < 5; ++i) best = std::max(best, 2.0 * kBytes / Seconds(copy) / 1e9);
  return best;
}

// The GPU's, over 1 GiB; 0 without one.
double DeviceCopyGBs() {
#ifdef KVTIER_RUNTIME_CUDA
  return kernels::cuda::DeviceCopyGBs(size_t{1} << 30);
#else
  return 0;
#endif
}

int Main(int argc, char** argv) {
  std::string sequence_counts = "8";
  uint64_t context = 2048, steps = 10;
  bool cuda_only = false;
  FlagParser flags("decode_bench [--sequences N[,N...]] [--context TOKENS] [--steps N] [--cuda-only]",
                   "Batched decode steps over long int8 contexts, 1 thread against every core and the GPU,\n"
                   "each against its memory roofline.");
  flags.AddString("sequences", &sequence_counts, "sequence counts stepped together, a set of rows each (1..1024)");
  flags.AddUint("context", &context, "tokens each sequence holds before the timed steps");
  flags.AddUint("steps", &steps, "timed decode steps after the first");
  flags.AddBool("cuda-only", &cuda_only, "the cuda rows alone (the caches prefilled on the GPU too)");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "decode_bench")) {
    return *exit;
  }
  std::vector<size_t> counts;
  for (absl::string_view text : absl::StrSplit(sequence_counts, ',')) {
    size_t n = 0;
    if (!absl::SimpleAtoi(text, &n) || n < 1 || n > 1024) {
      std::fprintf(stderr, "decode_bench: --sequences: '%s' is not a count in 1..1024\n", std::string(text).c_str());
      return 2;
    }
    counts.push_back(n);
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
  // The caches of the most sequences asked for; a row of n steps copies of
  // the first n.
  kernels::SetKernelThreads(cores);
  std::mt19937 rng(1);
  std::vector<SequenceCache> caches;
  std::vector<float> logits(m.config().vocab_size);
  for (size_t b = 0; b < *std::max_element(counts.begin(), counts.end()); ++b) {
    std::vector<uint32_t> prompt(context);
    for (uint32_t& t : prompt) t = rng() % m.config().vocab_size;
    caches.push_back(m.NewCache(kCodec, kTokensPerBlock));
    const Model& prefill = cuda_only ? **on_gpu : m;  // on_gpu is ok: checked above
    if (!prefill.Prefill(prompt, caches.back(), logits).ok()) return 1;
  }

  struct Row {
    const Model* model;
    size_t threads;  // 0: the GPU
    std::string name;
    double copy_gbs;
  };
  std::vector<Row> rows;
  for (size_t threads : {size_t{1}, cores}) {
    if (cuda_only) break;
    kernels::SetKernelThreads(threads);
    rows.push_back(
        {&m, threads, "cpu, " + std::to_string(threads) + (threads == 1 ? " thread" : " threads"), HostCopyGBs()});
  }
  if (on_gpu.ok()) rows.push_back({on_gpu->get(), 0, "cuda", DeviceCopyGBs()});

  std::printf("%zu-token int8 contexts, lite-attn, %zu steps; copy rate (GB/s read + written):", context, steps);
  for (const Row& row : rows) std::printf(" %s %.1f;", row.name.c_str(), row.copy_gbs);
  std::printf("\nroofline: the bytes a step must read (weights, latents) at that copy rate\n");
  std::printf("%9s %-14s %14s %10s %10s %11s %11s %12s %9s\n", "sequences", "device", "first step ms", "ms/step",
              "tok/s", "weights MB", "latents MB", "roofline ms", "x roofline");
  for (size_t n : counts) {
    const load::StepBytes bytes = load::DecodeStepBytes(m.config(), n, context, kCodec, kTokensPerBlock);
    for (const Row& row : rows) {
      kernels::SetKernelThreads(row.threads == 0 ? cores : row.threads);
      std::vector<SequenceCache> stepped(caches.begin(), caches.begin() + n);
      absl::StatusOr<double> first = load::TimeDecodeSteps(*row.model, stepped, 1);
      absl::StatusOr<double> seconds = first.ok() ? load::TimeDecodeSteps(*row.model, stepped, steps) : first;
      if (!seconds.ok()) {
        std::printf("%9zu %-14s failed: %s\n", n, row.name.c_str(), std::string(seconds.status().message()).c_str());
        return 1;
      }
      const double step_ms = *seconds / steps * 1e3;
      std::printf("%9zu %-14s %14.1f %10.3f %10.1f %11.1f %11.1f", n, row.name.c_str(), *first * 1e3, step_ms,
                  n * steps / *seconds, bytes.weights / 1e6, bytes.latents / 1e6);
      if (row.copy_gbs > 0) {
        const double roofline_ms = (bytes.weights + bytes.latents) / (row.copy_gbs * 1e9) * 1e3;
        std::printf(" %12.4f %9.1f\n", roofline_ms, step_ms / roofline_ms);
      } else {
        std::printf(" %12s %9s\n", "-", "-");  // the copy rate could not be measured
      }
    }
  }
  if (!on_gpu.ok()) std::printf("%-14s not run: %s\n", "cuda", std::string(on_gpu.status().message()).c_str());
  return 0;
}

}  // namespace
}  // namespace kvtier::runtime

int main(int argc, char** argv) { return kvtier::runtime::Main(argc, argv); }
