// GPU check and benchmark of DeepSeek-V4's attention kernels
// (cuda_v4_attention.h), for the device machine (no gtest there), on
// fresh random inputs:
// - the indexer's scores, v4-tiny's shape (4 heads of 32) and V4-Flash's
//   (64 heads of 128), rows of two sequences sharing their keys, each
//   seeing its own number of them: against float64 within 1e-5 of
//   sum_h |w_h| sum_d |q_hd k_d| (the CPU's V4IndexerScores held to the
//   same), and the top-k of the GPU's scores (cuda::SelectTopTokens)
//   exactly the CPU's choice over them;
// - attention with sinks, rows of 1 to 1,000 entries (and one of none),
//   4 heads of 80 and V4-Flash's 64 heads of 512: each output against
//   float64 within 1e-5 of the largest |entry| (an output is a weighted
//   mean of the entries with weights summing to at most 1; the CPU's
//   SinkAttention is held to the same), a row with no entries exactly 0.
// Then two tables at V4-Flash's shapes, batch 1-64: the indexer over a
// 64k-token context's 16,384 compressed keys, and one layer's decode
// attention (128 window entries and 512 chosen ones a row), bytes read
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
#include "kvtier/kernels/cuda_sparse_mla.h"
#include "kvtier/kernels/cuda_v4_attention.h"
#include "kvtier/kernels/indexer.h"
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

// Device memory a check allocates, freed with it.
class DeviceBuffers {
 public:
  DeviceBuffers() = default;
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (void* p : owned_) cudaFree(p);
  }
  template <typename T>
  T* Copy(const std::vector<T>& host) {
    return Own(ToDevice(host));
  }
  template <typename T>
  T* Room(size_t n) {
    T* p = nullptr;
    cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T));
    return Own(p);
  }

 private:
  template <typename T>
  T* Own(T* p) {
    owned_.push_back(p);
    return p;
  }
  std::vector<void*> owned_;
};

// Attention's inputs on the device, and room for its scores and outputs.
struct AttentionOnDevice {
  explicit AttentionOnDevice(const Rows& r)
      : q(d.Copy(r.q)),
        entries(d.Copy(r.entries)),
        sinks(d.Copy(r.sinks)),
        offsets(d.Copy(r.offsets)),
        counts(d.Copy(r.counts)),
        scratch(d.Room<float>(r.counts.size() * r.shape.heads * r.max_count)),
        out(d.Room<float>(r.q.size())) {}
  Status Run(const Rows& r) const {
    return cuda::SinkAttention(r.shape, static_cast<uint32_t>(r.counts.size()), q, entries, offsets, counts,
                               r.max_count, sinks, scratch, out, nullptr);
  }
  DeviceBuffers d;
  float *q, *entries, *sinks;
  int64_t* offsets;
  int32_t* counts;
  float *scratch, *out;
};

// The GPU's outputs for `rows`, or empty after a CUDA error.
std::vector<float> OnGpu(const Rows& r) {
  const AttentionOnDevice on(r);
  const Status s = on.Run(r);
  if (!s.ok()) std::printf("  cuda::SinkAttention: %s\n", s.message().c_str());
  std::vector<float> got = ToHost(on.out, r.q.size());
  return s.ok() && cudaDeviceSynchronize() == cudaSuccess ? got : std::vector<float>{};
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
  std::printf(
      "sink attention, %2u heads of %3u, %zu rows: %s (largest error against float64: GPU %.1e, CPU %.1e, "
      "bound %.1e%s)\n",
      heads, dim, r.counts.size(), ok ? "ok" : "MISMATCH", gpu_error, cpu_error, bound,
      empty_rows_zero ? "" : "; a row with no entries is not 0");
  return ok;
}

// The indexer's inputs: `rows` rows split between two sequences, row r of
// a sequence seeing the first visible[r] of its keys.
struct IndexerRows {
  uint32_t heads = 0, dim = 0;
  std::vector<float> q, weights, keys;
  std::vector<int64_t> key_offsets;
  std::vector<int32_t> visible;
  uint32_t max_visible = 0;
};

IndexerRows MakeIndexerRows(uint32_t heads, uint32_t dim, const std::vector<int32_t>& visible, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  IndexerRows r;
  r.heads = heads, r.dim = dim, r.visible = visible;
  for (int32_t v : visible) r.max_visible = std::max(r.max_visible, static_cast<uint32_t>(v));
  const size_t per_sequence = r.max_visible;
  r.keys.resize(2 * per_sequence * dim);
  for (size_t i = 0; i < visible.size(); ++i)
    r.key_offsets.push_back(i % 2 == 0 ? 0 : static_cast<int64_t>(per_sequence));
  r.q.resize(visible.size() * heads * dim);
  r.weights.resize(visible.size() * heads);
  for (float& v : r.q) v = normal(rng);
  for (float& v : r.keys) v = normal(rng);
  for (float& v : r.weights) v = normal(rng) / heads;
  return r;
}

// The indexer's inputs on the device, and room for its scores and choice.
struct IndexerOnDevice {
  IndexerOnDevice(const IndexerRows& r, uint32_t top)
      : k(top),
        q(d.Copy(r.q)),
        weights(d.Copy(r.weights)),
        keys(d.Copy(r.keys)),
        offsets(d.Copy(r.key_offsets)),
        visible(d.Copy(r.visible)),
        scores(d.Room<float>(r.visible.size() * r.max_visible)),
        selected(d.Room<int32_t>(r.visible.size() * top)),
        counts(d.Room<int32_t>(r.visible.size())) {}
  // Scores, then the top k of them.
  Status Run(const IndexerRows& r) const {
    const uint32_t rows = static_cast<uint32_t>(r.visible.size());
    const Status s =
        cuda::V4IndexerScores(r.heads, r.dim, rows, q, weights, keys, offsets, visible, r.max_visible, scores, nullptr);
    return s.ok() ? cuda::SelectTopTokens(rows, scores, r.max_visible, visible, k, selected, counts, nullptr) : s;
  }
  DeviceBuffers d;
  uint32_t k;
  float *q, *weights, *keys;
  int64_t* offsets;
  int32_t* visible;
  float* scores;
  int32_t *selected, *counts;
};

// Scores and the top-k over them on the GPU; false after a CUDA error.
bool IndexerOnGpu(const IndexerRows& r, uint32_t k, std::vector<float>& scores, std::vector<int32_t>& selected,
                  std::vector<int32_t>& counts) {
  const IndexerOnDevice on(r, k);
  const Status s = on.Run(r);
  if (!s.ok()) std::printf("  indexer: %s\n", s.message().c_str());
  scores = ToHost(on.scores, r.visible.size() * r.max_visible);
  selected = ToHost(on.selected, r.visible.size() * k);
  counts = ToHost(on.counts, r.visible.size());
  return s.ok() && cudaDeviceSynchronize() == cudaSuccess;
}

bool CheckIndexer(const IndexerRows& r, uint32_t k) {
  std::vector<float> scores;
  std::vector<int32_t> selected, counts;
  if (!IndexerOnGpu(r, k, scores, selected, counts)) return false;
  const uint32_t heads = r.heads, dim = r.dim;
  double worst = 0, cpu_worst = 0;
  bool chosen_equal = true;
  std::vector<float> cpu;
  for (size_t i = 0; i < r.visible.size(); ++i) {
    const float* q = r.q.data() + i * heads * dim;
    const float* w = r.weights.data() + i * heads;
    const float* keys = r.keys.data() + r.key_offsets[i] * dim;
    const size_t n = static_cast<size_t>(r.visible[i]);
    cpu.resize(n);
    V4IndexerScores(heads, dim, q, w, keys, n, cpu.data());
    for (size_t g = 0; g < n; ++g) {
      double want = 0, magnitude = 0;
      for (uint32_t h = 0; h < heads; ++h) {
        double dot = 0, size = 0;
        for (uint32_t d = 0; d < dim; ++d) {
          dot += double{q[h * dim + d]} * keys[g * dim + d];
          size += std::abs(double{q[h * dim + d]} * keys[g * dim + d]);
        }
        want += w[h] * std::max(dot, 0.0);
        magnitude += std::abs(w[h]) * size;
      }
      worst = std::max(worst, std::abs(scores[i * r.max_visible + g] - want) / magnitude);
      cpu_worst = std::max(cpu_worst, std::abs(cpu[g] - want) / magnitude);
    }
    std::vector<uint32_t> want;
    SelectTopTokens(std::span(scores).subspan(i * r.max_visible, n), k, want);
    std::sort(want.begin(), want.end());
    chosen_equal = chosen_equal && counts[i] == static_cast<int32_t>(want.size()) &&
                   std::equal(want.begin(), want.end(), selected.begin() + i * k,
                              [](uint32_t a, int32_t b) { return static_cast<int32_t>(a) == b; });
  }
  const bool ok = worst <= 1e-5 && cpu_worst <= 1e-5 && chosen_equal;
  std::printf(
      "V4 indexer, %2u heads of %3u, %zu rows, top %u: %s (largest error against float64: GPU %.1e, CPU "
      "%.1e of the magnitude; top-k %s)\n",
      heads, dim, r.visible.size(), k, ok ? "ok" : "MISMATCH", worst, cpu_worst,
      chosen_equal ? "the CPU's" : "NOT the CPU's");
  return ok;
}

// The V4-Flash indexer at a 64k-token context: `batch` rows scoring
// 16,384 keys (64 heads of 128) and choosing 512.
void IndexerBenchmark(std::mt19937_64& rng) {
  std::printf("\nV4-Flash indexer at 64k tokens (16,384 keys of 128, 64 heads, top 512)\n");
  std::printf("%6s %12s %12s %14s\n", "batch", "us/call", "GB/s", "of copy rate");
  const double copy = cuda::DeviceCopyGBs(size_t{256} << 20);
  for (uint32_t batch : {1u, 8u, 64u}) {
    IndexerRows r = MakeIndexerRows(64, 128, std::vector<int32_t>(batch, 16384), rng);
    for (int64_t& o : r.key_offsets) o = 0;  // one sequence's keys: each row reads them
    const IndexerOnDevice on(r, 512);
    const double ms = check::Milliseconds([&] { (void)on.Run(r); }, 20);
    const double gbs = static_cast<double>(batch) * 16384 * 128 * 4 / (ms * 1e6);
    std::printf("%6u %12.1f %12.1f %13.0f%%\n", batch, ms * 1e3, gbs, 100.0 * gbs / copy);
  }
}

// One V4-Flash layer's decode attention: `batch` rows of 640 entries.
void Benchmark(std::mt19937_64& rng) {
  std::printf("\nV4-Flash decode attention (64 heads of 512, 128 window + 512 chosen entries a row)\n");
  std::printf("%6s %12s %12s %14s\n", "batch", "us/call", "GB/s", "of copy rate");
  const double copy = cuda::DeviceCopyGBs(size_t{256} << 20);
  for (uint32_t batch : {1u, 8u, 64u}) {
    const Rows r = MakeRows(64, 512, std::vector<int32_t>(batch, 640), rng);
    const AttentionOnDevice on(r);
    const double ms = check::Milliseconds([&] { (void)on.Run(r); }, 20);
    const double gbs = r.entries.size() * 4.0 / (ms * 1e6);
    std::printf("%6u %12.1f %12.1f %13.0f%%\n", batch, ms * 1e3, gbs, 100.0 * gbs / copy);
  }
}

int Main(int argc, char** argv) {
  if (!check::DeviceOrSkip("V4's attention kernels were")) return 77;
  std::mt19937_64 rng(std::random_device{}());
  bool ok = CheckIndexer(MakeIndexerRows(4, 32, {1, 3, 9, 40, 17, 0}, rng), 4);
  ok = CheckIndexer(MakeIndexerRows(64, 128, {100, 700, 2049, 512, 1}, rng), 512) && ok;
  ok = Check(MakeRows(4, 80, {1, 17, 0, 20, 16, 3}, rng)) && ok;
  ok = Check(MakeRows(64, 512, {1, 128, 640, 1000, 129}, rng)) && ok;
  if (ok && check::WantBenchmark(argc, argv)) {
    IndexerBenchmark(rng);
    Benchmark(rng);
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::kernels

int main(int argc, char** argv) { return kvtier::kernels::Main(argc, argv); }
