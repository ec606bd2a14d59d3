#include "kvtier/kernels/layers.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace kvtier::kernels {

Status RmsNorm(std::span<const float> x, std::span<const float> weight, float eps, std::span<float> out) {
  if (x.empty() || weight.size() != x.size() || out.size() != x.size()) {
    return InvalidArgument("RmsNorm: x, weight and out must have the same non-zero size");
  }
  float sum = 0.0f;
  for (float v : x) sum += v * v;
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(x.size()) + eps);
  for (size_t i = 0; i < x.size(); ++i) out[i] = weight[i] * (x[i] * inv);
  return OkStatus();
}

Status SelectExperts(std::span<const float> logits, const GateParams& p, std::vector<ExpertChoice>& out) {
  const size_t n = logits.size();
  if (n == 0 || p.top_k < 1 || p.top_k > n) {
    return InvalidArgument("SelectExperts: top_k " + std::to_string(p.top_k) + " of " + std::to_string(n) + " experts");
  }
  if (p.group_limited && (p.n_group < 1 || n % p.n_group != 0 || p.topk_group < 1 || p.topk_group > p.n_group ||
                          p.top_k > p.topk_group * (n / p.n_group))) {
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
      groups.emplace_back(*std::max_element(scores.begin() + g * per_group, scores.begin() + (g + 1) * per_group), g);
    }
    std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<bool> keep(p.n_group, false);
    for (uint32_t i = 0; i < p.topk_group; ++i) keep[groups[i].second] = true;
    for (size_t e = 0; e < n; ++e) {
      if (!keep[e / per_group]) eligible[e] = 0.0f;  // masked_fill(..., 0.0)
    }
  }
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return eligible[a] > eligible[b]; });
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
