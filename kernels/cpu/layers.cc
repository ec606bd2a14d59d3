#include "kvtier/kernels/layers.h"

#include <algorithm>
#include <cmath>
#include <functional>
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

namespace {

// Each group's score for the group limit: its best expert's (V2), or the
// sum of its two best (V3, which needs two an expert group).
std::vector<std::pair<float, uint32_t>> GroupScores(const std::vector<float>& scores, const GateParams& p) {
  const size_t per_group = scores.size() / p.n_group;
  std::vector<std::pair<float, uint32_t>> groups;
  for (uint32_t g = 0; g < p.n_group; ++g) {
    std::vector<float> group(scores.begin() + g * per_group, scores.begin() + (g + 1) * per_group);
    std::partial_sort(group.begin(), group.begin() + (p.noaux_tc ? 2 : 1), group.end(), std::greater<float>());
    groups.emplace_back(p.noaux_tc ? group[0] + group[1] : group[0], g);
  }
  return groups;
}

}  // namespace

Status SelectExperts(std::span<const float> logits, const GateParams& p, std::vector<ExpertChoice>& out) {
  const size_t n = logits.size();
  if (n == 0 || p.top_k < 1 || p.top_k > n) {
    return InvalidArgument("SelectExperts: top_k " + std::to_string(p.top_k) + " of " + std::to_string(n) + " experts");
  }
  if (p.group_limited && (p.n_group < 1 || n % p.n_group != 0 || p.topk_group < 1 || p.topk_group > p.n_group ||
                          p.top_k > p.topk_group * (n / p.n_group) || (p.noaux_tc && n / p.n_group < 2))) {
    return InvalidArgument("SelectExperts: groups do not fit the experts and top_k");
  }
  if (p.noaux_tc && p.correction_bias.size() != n) {
    return InvalidArgument("SelectExperts: noaux_tc needs a correction bias for each of the " + std::to_string(n) +
                           " experts, got " + std::to_string(p.correction_bias.size()));
  }
  std::vector<float> scores(logits.begin(), logits.end());
  if (p.noaux_tc) {
    for (float& s : scores) s = 1.0f / (1.0f + std::exp(-s));
  } else {  // softmax, stable
    const float max = *std::max_element(scores.begin(), scores.end());
    float sum = 0.0f;
    for (float& s : scores) sum += (s = std::exp(s - max));
    for (float& s : scores) s /= sum;
  }
  // What the choice ranks: the scores, biased under noaux_tc.
  std::vector<float> eligible = scores;
  if (p.noaux_tc) {
    for (size_t e = 0; e < n; ++e) eligible[e] += p.correction_bias[e];
  }
  if (p.group_limited) {
    std::vector<std::pair<float, uint32_t>> groups = GroupScores(eligible, p);
    std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<bool> keep(p.n_group, false);
    for (uint32_t i = 0; i < p.topk_group; ++i) keep[groups[i].second] = true;
    const size_t per_group = n / p.n_group;
    const float excluded = p.noaux_tc ? -INFINITY : 0.0f;  // V2's masked_fill(..., 0.0)
    for (size_t e = 0; e < n; ++e) {
      if (!keep[e / per_group]) eligible[e] = excluded;
    }
  }
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return eligible[a] > eligible[b]; });
  out.clear();
  float picked = 0.0f;
  for (uint32_t i = 0; i < p.top_k; ++i) {
    const float weight = p.noaux_tc ? scores[order[i]] : eligible[order[i]];
    out.push_back({order[i], weight});
    picked += weight;
  }
  const bool normalize = p.top_k > 1 && p.norm_topk_prob;
  if (normalize) {
    for (ExpertChoice& c : out) c.weight /= picked + 1e-20f;
  }
  if (!normalize || p.noaux_tc) {
    for (ExpertChoice& c : out) c.weight *= p.routed_scaling_factor;
  }
  return OkStatus();
}

}  // namespace kvtier::kernels
