// Batched decode in process on the lite-attn preset (DeepSeek-V2-Lite's
// attention dims), with its projections in bf16 and in FP8 with 128 x 128
// block scales as DeepSeek-V3 publishes them (--weights): for each
// `--sequences` count, that many sequences
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
//   decode_bench [--sequences 8[,64...]] [--context 2048] [--steps 10] [--weights bf16,fp8]
//                [--cuda-only]
#include <algorithm>
#include <cstdio>
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
#include "load/host_copy_rate.h"
#include "services/base/flags.h"
#include "services/base/status.h"
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

// The GPU's, over 1 GiB; 0 without one.
double DeviceCopyGBs() {
#ifdef KVTIER_RUNTIME_CUDA
  return kernels::cuda::DeviceCopyGBs(size_t{1} << 30);
#else
  return 0;
#endif
}

// The lite-attn preset with its projections stored as `weights`, loaded on
// the CPU and, where one can be used, a GPU.
struct Loaded {
  std::string weights;
  ModelConfig config;
  std::unique_ptr<Model> cpu;
  absl::StatusOr<std::unique_ptr<Model>> gpu;
};

// Loads l's models from a checkpoint of l.config written to `dir`.
absl::Status MakeAndLoad(Loaded& l, const std::string& dir) {
  KVTIER_RETURN_IF_ERROR(MakeModel(l.config, dir, 3));
  KVTIER_ASSIGN_OR_RETURN(const std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(dir));
  KVTIER_ASSIGN_OR_RETURN(l.cpu, Model::Load(*checkpoint));
  l.gpu = Model::Load(*checkpoint, Device::kCuda);
  return absl::OkStatus();
}

absl::StatusOr<Loaded> LoadLiteAttn(const std::string& weights) {
  Loaded l{weights, *PresetConfig("lite-attn"), nullptr, nullptr};
  if (weights == "fp8") {
    l.config.fp8 = Fp8Quantization{128, 128};
  } else if (weights != "bf16") {
    return absl::InvalidArgumentError("--weights: '" + weights + "' is not bf16 or fp8");
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvtier_decode_bench_" + std::to_string(getpid()) + "_" + weights);
  const absl::Status loaded = MakeAndLoad(l, dir.string());
  std::filesystem::remove_all(dir);
  if (!loaded.ok()) return loaded;
  return l;
}

int Main(int argc, char** argv) {
  std::string sequence_counts = "8", weight_formats = "bf16,fp8";
  uint64_t context = 2048, steps = 10;
  bool cuda_only = false;
  FlagParser flags(
      "decode_bench [--sequences N[,N...]] [--context TOKENS] [--steps N] [--weights bf16,fp8] "
      "[--cuda-only]",
      "Batched decode steps over long int8 contexts, 1 thread against every core and the GPU,\n"
      "with bf16 and FP8 weights, each against its memory roofline.");
  flags.AddString("sequences", &sequence_counts, "sequence counts stepped together, a set of rows each (1..1024)");
  flags.AddUint("context", &context, "tokens each sequence holds before the timed steps");
  flags.AddUint("steps", &steps, "timed decode steps after the first");
  flags.AddString("weights", &weight_formats,
                  "how the projections are stored, a set of rows each: bf16, fp8 (128 x 128 block scales; the "
                  "CPU reads them as FP8, the GPU dequantizes them to bf16 at load)");
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
  std::vector<Loaded> models;
  for (const std::string& weights : std::vector<std::string>(absl::StrSplit(weight_formats, ','))) {
    absl::StatusOr<Loaded> loaded = LoadLiteAttn(weights);
    if (!loaded.ok()) {
      std::fprintf(stderr, "decode_bench: %s\n", std::string(loaded.status().message()).c_str());
      return loaded.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    models.push_back(*std::move(loaded));
  }
  const Model& m = *models[0].cpu;
  const absl::StatusOr<std::unique_ptr<Model>>& on_gpu = models[0].gpu;
  if (cuda_only && !on_gpu.ok()) {
    std::printf("%-14s not run: %s\n", "cuda", std::string(on_gpu.status().message()).c_str());
    return 0;
  }
  // The caches of the most sequences asked for; a row of n steps copies of
  // the first n (the same latents whatever the weights: a step's attention
  // does not depend on them).
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
    const Loaded* loaded;
    const Model* model;
    size_t threads;  // 0: the GPU
    std::string name;
    double copy_gbs;
  };
  std::vector<Row> rows;
  std::vector<double> host_copy_gbs;
  for (size_t threads : {size_t{1}, cores}) {
    if (cuda_only) break;
    kernels::SetKernelThreads(threads);
    host_copy_gbs.push_back(load::HostCopyGBs());
  }
  const double device_copy_gbs = on_gpu.ok() ? DeviceCopyGBs() : 0;
  for (const Loaded& l : models) {
    for (size_t i = 0; i < host_copy_gbs.size(); ++i) {
      const size_t threads = i == 0 ? 1 : cores;
      rows.push_back({&l, l.cpu.get(), threads,
                      "cpu, " + std::to_string(threads) + (threads == 1 ? " thread" : " threads"), host_copy_gbs[i]});
    }
    if (l.gpu.ok()) rows.push_back({&l, l.gpu->get(), 0, "cuda", device_copy_gbs});
  }

  std::printf("%zu-token int8 contexts, lite-attn, %zu steps; copy rate (GB/s read + written):", context, steps);
  for (size_t i = 0; i < host_copy_gbs.size(); ++i) {
    std::printf(" cpu, %zu thread%s %.1f;", i == 0 ? 1 : cores, i == 0 ? "" : "s", host_copy_gbs[i]);
  }
  if (on_gpu.ok()) std::printf(" cuda %.1f;", device_copy_gbs);
  std::printf("\nroofline: the bytes a step must read (weights as stored, latents) at that copy rate\n");
  std::printf("%9s %-7s %-14s %14s %10s %10s %11s %11s %12s %9s\n", "sequences", "weights", "device", "first step ms",
              "ms/step", "tok/s", "weights MB", "latents MB", "roofline ms", "x roofline");
  for (size_t n : counts) {
    for (const Row& row : rows) {
      const load::StepBytes bytes = load::DecodeStepBytes(row.loaded->config, n, context, kCodec, kTokensPerBlock);
      kernels::SetKernelThreads(row.threads == 0 ? cores : row.threads);
      std::vector<SequenceCache> stepped(caches.begin(), caches.begin() + n);
      absl::StatusOr<double> first = load::TimeDecodeSteps(*row.model, stepped, 1);
      absl::StatusOr<double> seconds = first.ok() ? load::TimeDecodeSteps(*row.model, stepped, steps) : first;
      if (!seconds.ok()) {
        std::printf("%9zu %-7s %-14s failed: %s\n", n, row.loaded->weights.c_str(), row.name.c_str(),
                    std::string(seconds.status().message()).c_str());
        return 1;
      }
      const double step_ms = *seconds / steps * 1e3;
      std::printf("%9zu %-7s %-14s %14.1f %10.3f %10.1f %11.1f %11.1f", n, row.loaded->weights.c_str(),
                  row.name.c_str(), *first * 1e3, step_ms, n * steps / *seconds, bytes.weights / 1e6,
                  bytes.latents / 1e6);
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
