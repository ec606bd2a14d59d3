// One MoE layer at DeepSeek-V2-Lite dims (64 routed experts, top-6, 2 shared,
// intermediate 1408, hidden 2048; float32 weights, 2.3 GB, or with --bf16
// as a bf16 checkpoint loads, 1.2 GB) for decode batches
// of 1-32 tokens: tokens/s, and the weight bytes the layer reads per second
// against this machine's memory read bandwidth measured in the same run (a
// decode-sized MoE is bound by reading its chosen experts' weights).
//
//   moe_bench [--rounds N] [--threads N] [--bf16]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/parallel.h"
#include "load/median.h"
#include "services/base/flags.h"
#include "services/runtime/ffn.h"

namespace kvtier::runtime {
namespace {

using load::Median;

constexpr size_t kHidden = 2048, kExperts = 64, kInter = 1408, kShared = 2;
using Clock = std::chrono::steady_clock;

// Uniform +-1/sqrt(cols) weights from a cheap generator: 2.3 GB of them.
void Fill(std::vector<float>& m, size_t n, std::mt19937_64& rng, float scale) {
  m.resize(n);
  for (size_t i = 0; i < n; ++i) m[i] = (static_cast<float>(rng() >> 40) / 16777216.0f * 2 - 1) * scale;
}

void Fill(WeightMatrix& m, size_t n, std::mt19937_64& rng, float scale, bool bf16) {
  Fill(m.f32, n, rng, scale);
  if (!bf16) return;
  for (float v : m.f32) m.bf16.push_back(kernels::FloatToBf16(v));
  m.f32 = {};
}

SwiGluWeights MakeSwiGlu(size_t inter, std::mt19937_64& rng, bool bf16) {
  SwiGluWeights w;
  w.inter = inter;
  Fill(w.gate, inter * kHidden, rng, 1 / std::sqrt(float{kHidden}), bf16);
  Fill(w.up, inter * kHidden, rng, 1 / std::sqrt(float{kHidden}), bf16);
  Fill(w.down, kHidden * inter, rng, 1 / std::sqrt(float(inter)), bf16);
  return w;
}

// Distinct experts the rows of x choose.
size_t ExpertsTouched(const MoeWeights& moe, const std::vector<float>& x, size_t rows) {
  std::set<uint32_t> touched;
  std::vector<float> logits(kExperts);
  std::vector<kernels::ExpertChoice> chosen;
  for (size_t r = 0; r < rows; ++r) {
    kernels::Gemv(moe.router.data(), kExperts, kHidden, x.data() + r * kHidden, logits.data());
    (void)kernels::SelectExperts(logits, moe.gate, chosen);
    for (const auto& c : chosen) touched.insert(c.expert);
  }
  return touched.size();
}

// Sum of 64-bit words over `buffer`, split over the kernel threads as the
// layer is: the read bound.
double ReadBandwidth(const std::vector<float>& buffer) {
  const size_t words = buffer.size() * sizeof(float) / 8;
  const auto* bytes = reinterpret_cast<const uint8_t*>(buffer.data());
  std::atomic<uint64_t> total{0};
  const auto start = Clock::now();
  kernels::ParallelFor(words, 1 << 20, [&](size_t begin, size_t end) {
    uint64_t sum = 0;
    for (size_t i = begin; i < end; ++i) {
      uint64_t w;
      std::memcpy(&w, bytes + 8 * i, 8);
      sum += w;
    }
    total += sum;
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (total == 42) std::puts("");  // keeps the sums alive
  return static_cast<double>(words * 8) / seconds;
}

int Main(int argc, char** argv) {
  uint64_t rounds = 5, threads = 1;
  bool bf16 = false;
  FlagParser flags("moe_bench [--rounds N] [--threads N] [--bf16]",
                   "One V2-Lite MoE layer for decode batches 1-32 against memory read bandwidth.");
  flags.AddUint("rounds", &rounds, "timed repetitions per batch (the median is shown)");
  flags.AddUint("threads", &threads, "kernel threads for the layer and the bandwidth probe");
  flags.AddBool("bf16", &bf16, "experts in bf16, as a bf16 checkpoint loads (default: float32)");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "moe_bench")) {
    return *exit;
  }
  rounds = std::max<uint64_t>(rounds, 1);
  kernels::SetKernelThreads(std::clamp<uint64_t>(threads, 1, 1024));

  std::mt19937_64 rng(11);
  std::fprintf(stderr, "making a %.1f GB MoE layer...\n",
               (bf16 ? 2.0 : 4.0) * (kExperts + kShared) * 3 * kInter * kHidden / 1e9);
  MoeWeights moe;
  moe.gate = {.top_k = 6,
              .group_limited = false,
              .n_group = 1,
              .topk_group = 1,
              .norm_topk_prob = false,
              .routed_scaling_factor = 1.0f};
  Fill(moe.router, kExperts * kHidden, rng, 1 / std::sqrt(float{kHidden}));
  for (size_t e = 0; e < kExperts; ++e) moe.experts.push_back(MakeSwiGlu(kInter, rng, bf16));
  moe.shared = MakeSwiGlu(kShared * kInter, rng, bf16);

  // The bandwidth bound over a buffer as large as all the experts' weights,
  // so neither fits in cache.
  std::vector<float> probe;
  Fill(probe, kExperts * 3 * kInter * kHidden / 4, rng, 1.0f);
  std::vector<double> bandwidths;
  for (uint64_t i = 0; i < rounds; ++i) bandwidths.push_back(ReadBandwidth(probe));
  const double bandwidth = Median(bandwidths);

  std::printf("%-6s %10s %9s %14s %12s %14s\n", "batch", "tokens/s", "experts", "weights MB/tok", "weight GB/s",
              "of read bw");
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t batch : {1, 2, 4, 8, 16, 32}) {
    std::vector<double> seconds;
    size_t touched = 0;
    std::vector<float> x(batch * kHidden), out(batch * kHidden);
    for (uint64_t i = 0; i < rounds; ++i) {
      for (float& v : x) v = normal(rng);  // fresh tokens: fresh routing
      touched += ExpertsTouched(moe, x, batch);
      const auto start = Clock::now();
      MoeForward(moe, kHidden, x.data(), batch, out.data());
      seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    const double t = Median(seconds);
    const double experts = static_cast<double>(touched) / static_cast<double>(rounds);
    const double bytes = static_cast<double>(MoeWeightBytes(moe, 0)) +
                         experts * static_cast<double>(MoeWeightBytes(moe, 1) - MoeWeightBytes(moe, 0));
    std::printf("%-6zu %10.1f %9.1f %14.1f %12.2f %13.0f%%\n", batch, batch / t, experts, bytes / batch / 1e6,
                bytes / t / 1e9, 100 * bytes / t / bandwidth);
  }
  const size_t probe_threads = kernels::KernelThreads();
  std::printf("memory read bandwidth (%zu thread%s, same run): %.2f GB/s\n", probe_threads,
              probe_threads == 1 ? "" : "s", bandwidth / 1e9);
  return 0;
}

}  // namespace
}  // namespace kvtier::runtime

int main(int argc, char** argv) { return kvtier::runtime::Main(argc, argv); }
