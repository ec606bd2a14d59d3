#include "kvtier/kernels/layers.h"

#include "codec_internal.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace kvtier::kernels {

namespace {

// Dot products of one weight row with M inputs, M fixed at compile time so
// the M x kLanes partial sums live in registers. The lanes are summed in a
// fixed order (lane-wise, then lanes 0..15, then the columns past the last
// full lane group), which Gemv repeats.
template <size_t M>
inline void DotTile(const float* row, size_t cols, const float* x, size_t x_stride, float* y,
                    size_t y_stride) {
  constexpr size_t kLanes = 16;
  const size_t full = cols / kLanes * kLanes;
  float lanes[M][kLanes] = {};
  for (size_t c = 0; c < full; c += kLanes) {
    for (size_t i = 0; i < M; ++i) {
      for (size_t j = 0; j < kLanes; ++j) lanes[i][j] += row[c + j] * x[i * x_stride + c + j];
    }
  }
  for (size_t i = 0; i < M; ++i) {
    float s = 0.0f;
    for (size_t j = 0; j < kLanes; ++j) s += lanes[i][j];
    for (size_t c = full; c < cols; ++c) s += row[c] * x[i * x_stride + c];
    y[i * y_stride] = s;
  }
}

}  // namespace

// Lane-wise partial sums let the compiler vectorize each dot product (one
// running float sum would stay scalar without reassociation); four inputs
// share each load of a weight row.
KVTIER_VECTOR_CLONES void Gemm(const float* w, size_t rows, size_t cols, const float* x, size_t n,
                               size_t x_stride, float* y, size_t y_stride) {
  for (size_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) DotTile<4>(row, cols, x + i * x_stride, x_stride, y + i * y_stride + r, y_stride);
    for (; i < n; ++i) DotTile<1>(row, cols, x + i * x_stride, x_stride, y + i * y_stride + r, y_stride);
  }
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
