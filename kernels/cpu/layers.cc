#include "kvtier/kernels/layers.h"

#include "codec_internal.h"
#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

namespace kvtier::kernels {

namespace {

// Helpers of the target-clone functions must be inlined into each clone:
// one left out of line is compiled for the baseline target only (measured:
// blocking Gemm's inputs un-inlined its tile and cut it from 20 to 7 G
// multiply-adds/s).
#define KVTIER_INLINE __attribute__((always_inline)) inline

// 16 floats as one GCC vector: each target clone maps it to its own
// registers (one zmm, two ymm or four xmm).
typedef float Lanes16 __attribute__((vector_size(64)));

// Inlined into each clone, so the vector never crosses a call: GCC's note
// that its return ABI differs without AVX-512 does not apply (to here and
// DotTile, which uses it).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
KVTIER_INLINE Lanes16 Load16(const float* p) {
  Lanes16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// 16 bf16 weights widened to floats (exactly: a bf16 is a float's top half).
typedef uint16_t Bf16Lanes16 __attribute__((vector_size(32)));
typedef uint32_t Bits16 __attribute__((vector_size(64)));
KVTIER_INLINE Lanes16 Load16(const uint16_t* p) {
  Bf16Lanes16 h;
  std::memcpy(&h, p, sizeof h);
  const Bits16 bits = __builtin_convertvector(h, Bits16) << 16;
  Lanes16 v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

KVTIER_INLINE float WeightAt(const float* row, size_t c) { return row[c]; }
KVTIER_INLINE float WeightAt(const uint16_t* row, size_t c) { return Bf16ToFloat(row[c]); }

// Dot products of one weight row with M inputs, M fixed at compile time.
// The partial sums are vector values, not an array, so that they stay in
// registers (as a float[M][16] array GCC kept them on the stack: a store
// and reload on every step, measured 10 G multiply-adds/s). The lanes are
// summed in a fixed order (lane-wise, then lanes 0..15, then the columns
// past the last full lane group), which Gemv repeats.
template <size_t M, typename Weight>
KVTIER_INLINE void DotTile(const Weight* row, size_t cols, const float* x, size_t x_stride, float* y,
                           size_t y_stride) {
  constexpr size_t kLanes = 16;
  const size_t full = cols / kLanes * kLanes;
  Lanes16 lanes[M] = {};
  for (size_t c = 0; c < full; c += kLanes) {
    const Lanes16 w = Load16(row + c);
    for (size_t i = 0; i < M; ++i) lanes[i] += w * Load16(x + i * x_stride + c);
  }
  for (size_t i = 0; i < M; ++i) {
    float s = 0.0f;
    for (size_t j = 0; j < kLanes; ++j) s += lanes[i][j];
    // An explicit fma: left to the compiler, the float and bf16 tails were
    // contracted differently (measured: other last bits).
    for (size_t c = full; c < cols; ++c) s = std::fma(WeightAt(row, c), x[i * x_stride + c], s);
    y[i * y_stride] = s;
  }
}
#pragma GCC diagnostic pop

// All weight rows against inputs [0, n), four inputs sharing each load of
// a weight row: Gemm's work for one block of inputs.
template <typename Weight>
KVTIER_INLINE void GemmRows(const Weight* w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride,
                            float* y, size_t y_stride) {
  for (size_t r = 0; r < rows; ++r) {
    const Weight* row = w + r * cols;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) DotTile<4>(row, cols, x + i * x_stride, x_stride, y + i * y_stride + r, y_stride);
    for (; i < n; ++i) DotTile<1>(row, cols, x + i * x_stride, x_stride, y + i * y_stride + r, y_stride);
  }
}

}  // namespace

namespace {

// Weight rows [row_begin, row_end) against all inputs, the inputs in blocks
// of 32 that stay in L2 while every row passes over them (2,048 inputs
// would otherwise be re-read from memory per row). A clones function of
// its own: the parallel chunks call it from lambdas, which would otherwise
// be compiled for the baseline target only.
template <typename Weight>
KVTIER_INLINE void GemmRowRangeOf(const Weight* w, size_t row_begin, size_t row_end, size_t cols, const float* x,
                                  size_t n, size_t x_stride, float* y, size_t y_stride) {
  constexpr size_t kInputBlock = 32;  // a multiple of the 4-input tile
  for (size_t i0 = 0; i0 < n; i0 += kInputBlock) {
    GemmRows(w + row_begin * cols, row_end - row_begin, cols, x + i0 * x_stride, std::min(kInputBlock, n - i0),
             x_stride, y + i0 * y_stride + row_begin, y_stride);
  }
}
KVTIER_VECTOR_CLONES void GemmRowRange(const float* w, size_t row_begin, size_t row_end, size_t cols,
                                       const float* x, size_t n, size_t x_stride, float* y, size_t y_stride) {
  GemmRowRangeOf(w, row_begin, row_end, cols, x, n, x_stride, y, y_stride);
}
KVTIER_VECTOR_CLONES void GemmRowRange(const uint16_t* w, size_t row_begin, size_t row_end, size_t cols,
                                       const float* x, size_t n, size_t x_stride, float* y, size_t y_stride) {
  GemmRowRangeOf(w, row_begin, row_end, cols, x, n, x_stride, y, y_stride);
}

// Gemm's split of the weight rows among the kernel threads: about 1 M
// multiply-adds a chunk (with one input row, as in a single sequence's
// decode step, 4 MB of float weights, far more than waking a thread
// costs); each output is still one dot product in one thread, so results
// do not depend on the split.
template <typename Weight>
void GemmOf(const Weight* w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
            size_t y_stride) {
  const size_t per_row = std::max<size_t>(cols * n, 1);
  ParallelFor(rows, std::max<size_t>((size_t{1} << 20) / per_row, 8), [&](size_t begin, size_t end) {
    GemmRowRange(w, begin, end, cols, x, n, x_stride, y, y_stride);
  });
}

}  // namespace

void Gemm(const float* w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
          size_t y_stride) {
  GemmOf(w, rows, cols, x, n, x_stride, y, y_stride);
}

void GemmBf16(const uint16_t* w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
              size_t y_stride) {
  GemmOf(w, rows, cols, x, n, x_stride, y, y_stride);
}

// Absorbed attention calls this per token with one row: no tile loop.
KVTIER_VECTOR_CLONES void Gemv(const float* w, size_t rows, size_t cols, const float* x, float* y) {
  for (size_t r = 0; r < rows; ++r) DotTile<1>(w + r * cols, cols, x, cols, y + r, 1);
}

Status RmsNorm(std::span<const float> x, std::span<const float> weight, float eps,
               std::span<float> out) {
  if (x.empty() || weight.size() != x.size() || out.size() != x.size()) {
    return InvalidArgument("RmsNorm: x, weight and out must have the same non-zero size");
  }
  float sum = 0.0f;
  for (float v : x) sum += v * v;
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(x.size()) + eps);
  for (size_t i = 0; i < x.size(); ++i) out[i] = weight[i] * (x[i] * inv);
  return OkStatus();
}

Status SelectExperts(std::span<const float> logits, const GateParams& p,
                     std::vector<ExpertChoice>& out) {
  const size_t n = logits.size();
  if (n == 0 || p.top_k < 1 || p.top_k > n) {
    return InvalidArgument("SelectExperts: top_k " + std::to_string(p.top_k) + " of " +
                           std::to_string(n) + " experts");
  }
  if (p.group_limited && (p.n_group < 1 || n % p.n_group != 0 || p.topk_group < 1 ||
                          p.topk_group > p.n_group || p.top_k > p.topk_group * (n / p.n_group))) {
    return InvalidArgument("SelectExperts: groups do not fit the experts and top_k");
  }
  // Softmax, stable.
  std::vector<float> scores(logits.begin(), logits.end());
  const float max = *std::max_element(scores.begin(), scores.end());
  float sum = 0.0f;
  for (float& s : scores) sum += (s = std::exp(s - max));
  for (float& s : scores) s /= sum;

  std::vector<float> eligible = scores;
  if (p.group_limited) {
    const size_t per_group = n / p.n_group;
    std::vector<std::pair<float, uint32_t>> groups;
    for (uint32_t g = 0; g < p.n_group; ++g) {
      groups.emplace_back(*std::max_element(scores.begin() + g * per_group,
                                            scores.begin() + (g + 1) * per_group), g);
    }
    std::stable_sort(groups.begin(), groups.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<bool> keep(p.n_group, false);
    for (uint32_t i = 0; i < p.topk_group; ++i) keep[groups[i].second] = true;
    for (size_t e = 0; e < n; ++e) {
      if (!keep[e / per_group]) eligible[e] = 0.0f;  // masked_fill(..., 0.0)
    }
  }
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return eligible[a] > eligible[b]; });
  out.clear();
  float picked = 0.0f;
  for (uint32_t i = 0; i < p.top_k; ++i) {
    out.push_back({order[i], eligible[order[i]]});
    picked += eligible[order[i]];
  }
  if (p.top_k > 1 && p.norm_topk_prob) {
    for (ExpertChoice& c : out) c.weight /= picked + 1e-20f;
  } else {
    for (ExpertChoice& c : out) c.weight *= p.routed_scaling_factor;
  }
  return OkStatus();
}

}  // namespace kvtier::kernels
