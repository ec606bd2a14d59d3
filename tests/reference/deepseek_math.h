// DeepSeek-V2's and V3's math written plainly in double, following its modeling code
// line by line: the independent references the kernels and the runtime are
// checked against. Test-only.
#ifndef KVTIER_TESTS_REFERENCE_DEEPSEEK_MATH_H_
#define KVTIER_TESTS_REFERENCE_DEEPSEEK_MATH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>
#include <numeric>
#include <utility>
#include <vector>

#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/rope.h"

namespace kvtier::kernels {

// DeepseekV2(Yarn)RotaryEmbedding + apply_rotary_pos_emb, in double, written
// the way the Python does it: build cos/sin over cat(freqs, freqs), view the
// input as (d/2, 2) and transpose, then x*cos + rotate_half(x)*sin.
inline std::vector<double> ReferenceRope(const std::vector<double>& x, int64_t pos, double base,
                                         const YarnParams* yarn) {
  const size_t d = x.size(), half = d / 2;
  std::vector<double> inv(half);
  for (size_t i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(base, static_cast<double>(2 * i) / d);
  double mscale = 1.0;
  if (yarn != nullptr) {
    auto corr = [&](double rot) {
      return (d *
              std::log(static_cast<double>(yarn->original_max_position_embeddings) / (rot * 2 * std::numbers::pi))) /
             (2 * std::log(base));
    };
    double low = std::max(std::floor(corr(yarn->beta_fast)), 0.0);
    double high = std::min(std::ceil(corr(yarn->beta_slow)), static_cast<double>(d - 1));
    if (low == high) high += 0.001;
    for (size_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double mask = 1.0 - ramp;
      inv[i] = (inv[i] / yarn->factor) * (1 - mask) + inv[i] * mask;
    }
    auto m = [&](double s, double ms) { return s <= 1 ? 1.0 : 0.1 * ms * std::log(s) + 1.0; };
    mscale = m(yarn->factor, yarn->mscale) / m(yarn->factor, yarn->mscale_all_dim);
  }
  std::vector<double> cos(d), sin(d), y(d), rot(d), out(d);
  for (size_t j = 0; j < d; ++j) {
    cos[j] = std::cos(pos * inv[j % half]) * mscale;
    sin[j] = std::sin(pos * inv[j % half]) * mscale;
  }
  for (size_t i = 0; i < half; ++i) y[i] = x[2 * i], y[half + i] = x[2 * i + 1];  // view+transpose
  for (size_t j = 0; j < half; ++j) rot[j] = -y[half + j], rot[half + j] = y[j];  // rotate_half
  for (size_t j = 0; j < d; ++j) out[j] = y[j] * cos[j] + rot[j] * sin[j];
  return out;
}

// An FP8 E4M3FN code's value from its fields: (-1)^s 2^(e-7) (1 + m/8),
// or (-1)^s 2^-6 (m/8) when e is 0. (NaN codes are not asked for.)
inline double ReferenceE4m3Value(uint8_t code) {
  const int e = (code >> 3) & 0xf, m = code & 7;
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}

// The E4M3FN code nearest to v (|v| <= 448), by trying every finite code,
// ties to the even code; the sign is v's (a value that rounds to zero
// keeps it, as the cast does).
inline uint8_t ReferenceNearestE4m3(double v) {
  int best = 0;
  for (int code = 1; code < 0x7f; ++code) {  // the non-negative finite codes
    const double d = std::fabs(ReferenceE4m3Value(static_cast<uint8_t>(code)) - std::fabs(v));
    const double b = std::fabs(ReferenceE4m3Value(static_cast<uint8_t>(best)) - std::fabs(v));
    if (d < b || (d == b && code % 2 == 0 && best % 2 == 1)) best = code;
  }
  return static_cast<uint8_t>(best | (std::signbit(v) ? 0x80 : 0));
}

// What a reference gate ranked: per expert the value top_k was taken by
// (a losing group's masked), and per group its score (none ungrouped).
struct GateRanking {
  std::vector<double> experts, groups;
};

// DeepseekV2MoEGate in double: softmax, (group mask), top-k, then
// renormalise if top_k > 1 and norm_topk_prob, else scale. With noaux_tc,
// DeepseekV3's MoEGate instead: ReferenceNoauxGate. With `ranking`, also
// what it ranked.
inline std::vector<std::pair<uint32_t, double>> ReferenceNoauxGate(const std::vector<float>& logits,
                                                                   const GateParams& p, GateRanking* ranking);
inline std::vector<std::pair<uint32_t, double>> ReferenceGate(const std::vector<float>& logits, const GateParams& p,
                                                              GateRanking* ranking = nullptr) {
  if (p.noaux_tc) return ReferenceNoauxGate(logits, p, ranking);
  const size_t n = logits.size();
  std::vector<double> s(n);
  double max = *std::max_element(logits.begin(), logits.end()), sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (s[i] = std::exp(logits[i] - max));
  for (double& v : s) v /= sum;
  if (p.group_limited) {
    const size_t per = n / p.n_group;
    std::vector<std::pair<double, uint32_t>> g;
    for (uint32_t k = 0; k < p.n_group; ++k) {
      g.push_back({*std::max_element(s.begin() + k * per, s.begin() + (k + 1) * per), k});
    }
    if (ranking != nullptr) {
      for (const auto& [score, group] : g) ranking->groups.push_back(score);
    }
    std::stable_sort(g.begin(), g.end(), [](auto& a, auto& b) { return a.first > b.first; });
    std::vector<bool> keep(p.n_group);
    for (uint32_t k = 0; k < p.topk_group; ++k) keep[g[k].second] = true;
    for (size_t e = 0; e < n; ++e)
      if (!keep[e / per]) s[e] = 0;
  }
  if (ranking != nullptr) ranking->experts = s;
  std::vector<uint32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return s[a] > s[b]; });
  std::vector<std::pair<uint32_t, double>> out;
  double total = 0;
  for (uint32_t k = 0; k < p.top_k; ++k) out.push_back({idx[k], s[idx[k]]}), total += s[idx[k]];
  for (auto& [e, w] : out) w = (p.top_k > 1 && p.norm_topk_prob) ? w / (total + 1e-20) : w * p.routed_scaling_factor;
  return out;
}

// DeepseekV3's MoEGate (topk_method noaux_tc) in double, as its modeling
// code writes it: scores = sigmoid(logits); scores_for_choice = scores +
// e_score_correction_bias; group_scores = the sum of each group's top 2
// of those; the topk_group best groups kept, the rest masked to -inf;
// top_k of scores_for_choice; weights gathered from the unbiased scores,
// divided by their sum (+1e-20) if top_k > 1 and norm_topk_prob, then
// times routed_scaling_factor.
inline std::vector<std::pair<uint32_t, double>> ReferenceNoauxGate(const std::vector<float>& logits,
                                                                   const GateParams& p, GateRanking* ranking) {
  const size_t n = logits.size();
  std::vector<double> scores(n), choice(n);
  for (size_t i = 0; i < n; ++i) {
    scores[i] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[i])));
    choice[i] = scores[i] + p.correction_bias[i];
  }
  if (p.n_group > 1) {
    const size_t per = n / p.n_group;
    std::vector<std::pair<double, uint32_t>> groups;
    for (uint32_t g = 0; g < p.n_group; ++g) {
      std::vector<double> members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(members.begin(), members.end(), std::greater<double>());
      groups.push_back({members[0] + members[1], g});
      if (ranking != nullptr) ranking->groups.push_back(members[0] + members[1]);
    }
    std::stable_sort(groups.begin(), groups.end(), [](auto& a, auto& b) { return a.first > b.first; });
    std::vector<bool> keep(p.n_group, false);
    for (uint32_t k = 0; k < p.topk_group; ++k) keep[groups[k].second] = true;
    for (size_t e = 0; e < n; ++e)
      if (!keep[e / per]) choice[e] = -INFINITY;
  }
  if (ranking != nullptr) ranking->experts = choice;
  std::vector<uint32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return choice[a] > choice[b]; });
  std::vector<std::pair<uint32_t, double>> out;
  double total = 0;
  for (uint32_t k = 0; k < p.top_k; ++k) out.push_back({idx[k], scores[idx[k]]}), total += scores[idx[k]];
  for (auto& [e, w] : out) {
    if (p.top_k > 1 && p.norm_topk_prob) w /= total + 1e-20;
    w *= p.routed_scaling_factor;
  }
  return out;
}

}  // namespace kvtier::kernels

#endif  // KVTIER_TESTS_REFERENCE_DEEPSEEK_MATH_H_
