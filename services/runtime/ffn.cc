#include "services/runtime/ffn.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "services/runtime/matmul.h"

namespace kvtier::runtime {

void SwiGluForward(const SwiGluWeights& w, size_t hidden, const float* x, size_t n,
                   const float* weights, const uint32_t* out_rows, float* out) {
  std::vector<float> g(n * w.inter), u(n * w.inter), y(n * hidden);
  MatMul(w.gate, w.inter, hidden, x, n, g.data());
  MatMul(w.up, w.inter, hidden, x, n, u.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  MatMul(w.down, hidden, w.inter, g.data(), n, y.data());
  for (size_t i = 0; i < n; ++i) {
    const float scale = weights == nullptr ? 1.0f : weights[i];
    float* o = out + (out_rows == nullptr ? i : out_rows[i]) * hidden;
    for (size_t j = 0; j < hidden; ++j) o[j] += scale * y[i * hidden + j];
  }
}

void MoeForward(const MoeWeights& w, size_t hidden, const float* x, size_t n, float* out) {
  const size_t experts = w.experts.size();
  std::fill(out, out + n * hidden, 0.0f);
  std::vector<float> router_logits(n * experts);
  MatMul(w.router, experts, hidden, x, n, router_logits.data());
  std::vector<std::vector<uint32_t>> rows_of(experts);
  std::vector<std::vector<float>> weights_of(experts);
  std::vector<kernels::ExpertChoice> chosen;
  for (size_t i = 0; i < n; ++i) {
    (void)kernels::SelectExperts(std::span(router_logits).subspan(i * experts, experts), w.gate, chosen);
    for (const kernels::ExpertChoice& e : chosen) {
      rows_of[e.expert].push_back(static_cast<uint32_t>(i));
      weights_of[e.expert].push_back(e.weight);
    }
  }
  std::vector<float> gathered;
  for (size_t e = 0; e < experts; ++e) {
    const std::vector<uint32_t>& rows = rows_of[e];
    if (rows.empty()) continue;
    gathered.resize(rows.size() * hidden);
    for (size_t i = 0; i < rows.size(); ++i) std::copy_n(x + rows[i] * hidden, hidden, gathered.data() + i * hidden);
    SwiGluForward(w.experts[e], hidden, gathered.data(), rows.size(), weights_of[e].data(), rows.data(), out);
  }
  if (w.shared.inter > 0) SwiGluForward(w.shared, hidden, x, n, nullptr, nullptr, out);
}

size_t MoeWeightBytes(const MoeWeights& w, size_t hidden, size_t experts_touched) {
  const size_t per_expert = w.experts.empty() ? 0 : 3 * w.experts[0].inter * hidden;
  return sizeof(float) * (w.router.size() + experts_touched * per_expert + 3 * w.shared.inter * hidden);
}

}  // namespace kvtier::runtime
