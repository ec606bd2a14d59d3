// GPU check and benchmark of DeepSeek-V4's attention with sinks
// (cuda_sink_attention.h), for the device machine (no gtest there), on
// fresh random inputs: rows of 1 to 1,000 entries (and one of none), the
// v4-tiny shape (4 heads of 80) and V4-Flash's (64 heads of 512). Each
// output against float64 within 1e-5 of the largest |entry| (an output is
// a weighted mean of the entries with weights summing to at most 1; the
// CPU's SinkAttention is held to the same), a row with no entries exactly
// 0. Then a table: one layer's decode attention at V4-Flash's shape (128
// window entries and 512 chosen ones a row), batch 1-64, entry bytes read
// per second against the device-to-device copy rate.
// Exit codes: 0 pass, 1 mismatch or CUDA error, 77 no device (ctest: skip).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "check_util.h"
#include "kvtier/kernels/cuda_device.h"
#include "kvtier/kernels/cuda_sink_attention.h"
#include "kvtier/kernels/sink_attention.h"

namespace kvtier::kernels {
namespace {

using check::ToDevice;
using check::ToHost;

struct Rows {
  SinkAttentionShape shape;
  std::vector<int32_t> counts;
  std::vector<int64_t> offsets;
  std::vector<float> q, entries, sinks;
  uint32_t max_count = 0;
};

Rows MakeRows(uint32_t heads, uint32_t dim, const std::vector<int32_t>& counts, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Rows r;
  r.shape = {heads, dim, 1.0f / std::sqrt(static_cast<float>(dim))};
  r.counts = counts;
  int64_t total = 0;
  for (int32_t c : counts) {
    r.offsets.push_back(total);
    total += c;
    r.max_count = std::max(r.max_count, static_cast<uint32_t>(c));
  }
  r.q.resize(counts.size() * heads * dim);
  r.entries.resize(static_cast<size_t>(total) * dim);
  r.sinks.resize(heads);
  for (float& v : r.q) v = normal(rng);
  for (float& v : r.entries) v = normal(rng);
  for (float& v : r.sinks) v = 2.0f * normal(rng);
  return r;
}

// The GPU's outputs for `rows`, or empty after a CUDA error.
std::vector<float> OnGpu(const Rows& r) {
  const uint32_t n = static_cast<uint32_t>(r.counts.size());
  float *q = ToDevice(r.q), *entries = ToDevice(r.entries), *sinks = ToDevice(r.sinks);
  int64_t* offsets = ToDevice(r.offsets);
  int32_t* counts = ToDevice(r.counts);
  float *scratch = nullptr, *out = nullptr;
  cudaMalloc(&scratch, std::max<size_t>(1, size_t{n} * r.shape.heads * r.max_count) * 4);
  cudaMalloc(&out, r.q.size() * 4);
  const Status s =
      cuda::SinkAttention(r.shape, n, q, entries, offsets, counts, r.max_count, sinks, scratch, out, nullptr);
  std::vector<float> got = ToHost(out, r.q.size());
  const bool ran = s.ok() && cudaDeviceSynchronize() == cudaSuccess;
  if (!s.ok()) std::printf("  cuda::SinkAttention: %s\n", s.message().c_str());
  for (void* p : {static_cast<void*>(q), static_cast<void*>(entries), static_cast<void*>(sinks),
                  static_cast<void*>(offsets), static_cast<void*>(counts), static_cast<void*>(scratch),
                  static_cast<void*>(out)}) {
    cudaFree(p);
  }
  return ran ? got : std::vector<float>{};
}

// Row i, head h in float64.
void Reference(const Rows& r, size_t i, uint32_t h, std::vector<double>& out) {
  const uint32_t dim = r.shape.dim;
  const float* q = r.q.data() + (i * r.shape.heads + h) * dim;
  const float* kv = r.entries.data() + r.offsets[i] * dim;
  const int32_t m = r.counts[i];
  std::vector<double> s(m);
  double top = -INFINITY;
  for (int32_t e = 0; e < m; ++e) {
    double dot = 0;
    for (uint32_t d = 0; d < dim; ++d) dot += double{q[d]} * kv[size_t(e) * dim + d];
    s[e] = dot * r.shape.scale;
    top = std::max(top, s[e]);
  }
  double sum = 0;
  for (double& v : s) sum += v = std::exp(v - top);
  const double denominator = sum + std::exp(double{r.sinks[h]} - top);
  out.assign(dim, 0.0);
  for (int32_t e = 0; e < m; ++e) {
    for (uint32_t d = 0; d < dim; ++d) out[d] += s[e] / denominator * kv[size_t(e) * dim + d];
  }
}

bool Check(const Rows& r) {
  const std::vector<float> gpu = OnGpu(r);
  if (gpu.empty()) return false;
  const uint32_t heads = r.shape.heads, dim = r.shape.dim;
  std::vector<float> cpu(r.q.size());
  float largest = 0;
  for (float v : r.entries) largest = std::max(largest, std::abs(v));
  const double bound = 1e-5 * largest;
  double gpu_error = 0, cpu_error = 0;
  bool empty_rows_zero = true;
  std::vector<double> want;
  for (size_t i = 0; i < r.counts.size(); ++i) {
    SinkAttention(r.shape, r.q.data() + i * heads * dim, r.entries.data() + r.offsets[i] * dim,
                  static_cast<size_t>(r.counts[i]), r.sinks.data(), cpu.data() + i * heads * dim);
    for (uint32_t h = 0; h < heads; ++h) {
      Reference(r, i, h, want);
      for (uint32_t d = 0; d < dim; ++d) {
        const size_t k = (i * heads + h) * dim + d;
        gpu_error = std::max(gpu_error, std::abs(gpu[k] - want[d]));
        cpu_error = std::max(cpu_error, std::abs(cpu[k] - want[d]));
        if (r.counts[i] == 0 && gpu[k] != 0.0f) empty_rows_zero = false;
      }
    }
  }
  const bool ok = gpu_error <= bound && cpu_error <= bound && empty_rows_zero;
  std::printf("sink attention, %2u heads of %3u, %zu rows: %s (largest error against float64: GPU %.1e, CPU %.1e, "
              "bound %.1e%s)\n",
              heads, dim, r.counts.size(), ok ? "ok" : "MISMATCH", gpu_error, cpu_error, bound,
              empty_rows_zero ? "" : "; a row with no entries is not 0");
  return ok;
}

// One V4-Flash layer's decode attention: `batch` rows of 640 entries.
void Benchmark(std::mt19937_64& rng) {
  std::printf("\nV4-Flash decode attention (64 heads of 512, 128 window + 512 chosen entries a row)\n");
  std::printf("%6s %12s %12s %14s\n", "batch", "us/call", "GB/s", "of copy rate");
  const double copy = cuda::DeviceCopyGBs(size_t{256} << 20);
  for (uint32_t batch : {1u, 8u, 64u}) {
    const Rows r = MakeRows(64, 512, std::vector<int32_t>(batch, 640), rng);
    float *q = ToDevice(r.q), *entries = ToDevice(r.entries), *sinks = ToDevice(r.sinks);
    int64_t* offsets = ToDevice(r.offsets);
    int32_t* counts = ToDevice(r.counts);
    float *scratch = nullptr, *out = nullptr;
    cudaMalloc(&scratch, size_t{batch} * 64 * r.max_count * 4);
    cudaMalloc(&out, r.q.size() * 4);
    const double ms = check::Milliseconds(
        [&] {
          (void)cuda::SinkAttention(r.shape, batch, q, entries, offsets, counts, r.max_count, sinks, scratch, out,
                                    nullptr);
        },
        20);
    const double gbs = r.entries.size() * 4.0 / (ms * 1e6);
    std::printf("%6u %12.1f %12.1f %13.0f%%\n", batch, ms * 1e3, gbs, 100.0 * gbs / copy);
    for (void* p : {static_cast<void*>(q), static_cast<void*>(entries), static_cast<void*>(sinks),
                    static_cast<void*>(offsets), static_cast<void*>(counts), static_cast<void*>(scratch),
                    static_cast<void*>(out)}) {
      cudaFree(p);
    }
  }
}

int Main(int argc, char** argv) {
  if (!check::DeviceOrSkip("V4's sink attention was")) return 77;
  std::mt19937_64 rng(std::random_device{}());
  bool ok = Check(MakeRows(4, 80, {1, 17, 0, 20, 16, 3}, rng));
  ok = Check(MakeRows(64, 512, {1, 128, 640, 1000, 129}, rng)) && ok;
  if (ok && check::WantBenchmark(argc, argv)) Benchmark(rng);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::kernels

int main(int argc, char** argv) { return kvtier::kernels::Main(argc, argv); }
