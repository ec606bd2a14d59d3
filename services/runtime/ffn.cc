#include "services/runtime/ffn.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "kvtier/kernels/parallel.h"
#include "services/runtime/matmul.h"

namespace kvtier::runtime {

namespace {

// y = x W^T, as DeepSeek-V4 rounds the inputs when w says so.
void Product(const SwiGluWeights& w, const WeightMatrix& m, size_t rows, size_t cols, const float* x, size_t n,
             float* y) {
  if (w.round_inputs) return MatMulRoundingInputs(m, rows, cols, x, n, y);
  MatMul(m, rows, cols, x, n, y);
}

// y[n][hidden] = SwiGLU(x) for the n rows of x, row i weighted by
// weights[i] when w.weight_before_down (else the caller weighs y).
void SwiGluRows(const SwiGluWeights& w, size_t hidden, const float* x, size_t n, const float* weights, float* y) {
  std::vector<float> g(n * w.inter), u(n * w.inter);
  Product(w, w.gate, w.inter, hidden, x, n, g.data());
  Product(w, w.up, w.inter, hidden, x, n, u.data());
  if (w.limit > 0) {
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = std::min(g[i], w.limit);
      u[i] = std::clamp(u[i], -w.limit, w.limit);
    }
  }
  for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  if (w.weight_before_down && weights != nullptr) {
    for (size_t i = 0; i < g.size(); ++i) g[i] *= weights[i / w.inter];
  }
  Product(w, w.down, hidden, w.inter, g.data(), n, y);
}

// out[out_rows[i]] += weights[i] * y[i] (defaults as SwiGluForward's).
void AddRows(const float* y, size_t hidden, size_t n, const float* weights, const uint32_t* out_rows, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const float scale = weights == nullptr ? 1.0f : weights[i];
    float* o = out + (out_rows == nullptr ? i : out_rows[i]) * hidden;
    for (size_t j = 0; j < hidden; ++j) o[j] += scale * y[i * hidden + j];
  }
}

}  // namespace

void SwiGluForward(const SwiGluWeights& w, size_t hidden, const float* x, size_t n, const float* weights,
                   const uint32_t* out_rows, float* out) {
  std::vector<float> y(n * hidden);
  SwiGluRows(w, hidden, x, n, weights, y.data());
  AddRows(y.data(), hidden, n, w.weight_before_down ? nullptr : weights, out_rows, out);
}

void MoeForward(const MoeWeights& w, size_t hidden, const float* x, size_t n, float* out) {
  const size_t experts = w.experts.size();
  std::vector<float> router_logits(n * experts);
  MatMul(w.router, experts, hidden, x, n, router_logits.data());
  std::vector<std::vector<kernels::ExpertChoice>> chosen(n);
  for (size_t i = 0; i < n; ++i) {
    (void)kernels::SelectExperts(std::span(router_logits).subspan(i * experts, experts), w.gate, chosen[i]);
  }
  MoeForwardRouted(w, hidden, x, n, chosen, out);
}

void MoeForwardRouted(const MoeWeights& w, size_t hidden, const float* x, size_t n,
                      const std::vector<std::vector<kernels::ExpertChoice>>& chosen, float* out) {
  const size_t experts = w.experts.size();
  std::fill(out, out + n * hidden, 0.0f);
  std::vector<std::vector<uint32_t>> rows_of(experts);
  std::vector<std::vector<float>> weights_of(experts);
  for (size_t i = 0; i < n; ++i) {
    for (const kernels::ExpertChoice& e : chosen[i]) {
      rows_of[e.expert].push_back(static_cast<uint32_t>(i));
      weights_of[e.expert].push_back(e.weight);
    }
  }
  // Each chosen expert into its own rows of `y`, then added to `out` in
  // expert order, as one thread would, so the sums do not depend on the
  // thread count. With few rows an expert (decode) the experts are the
  // kernel threads' jobs, their own products too small to split well; with
  // many (prefill) each expert's products split evenly over the threads,
  // however unevenly the rows were routed.
  std::vector<size_t> chosen_experts, y_row;  // y_row[k]: where expert k's rows start in y
  size_t y_rows = 0;
  for (size_t e = 0; e < experts; ++e) {
    if (rows_of[e].empty()) continue;
    chosen_experts.push_back(e);
    y_row.push_back(y_rows);
    y_rows += rows_of[e].size();
  }
  std::vector<float> y(y_rows * hidden);
  const auto run = [&](size_t begin, size_t end) {
    std::vector<float> gathered;
    for (size_t k = begin; k < end; ++k) {
      const std::vector<uint32_t>& rows = rows_of[chosen_experts[k]];
      gathered.resize(rows.size() * hidden);
      for (size_t i = 0; i < rows.size(); ++i) std::copy_n(x + rows[i] * hidden, hidden, gathered.data() + i * hidden);
      SwiGluRows(w.experts[chosen_experts[k]], hidden, gathered.data(), rows.size(),
                 weights_of[chosen_experts[k]].data(), y.data() + y_row[k] * hidden);
    }
  };
  constexpr size_t kRowsForSplitExperts = 32;  // an expert's rows, on average
  if (y_rows >= kRowsForSplitExperts * chosen_experts.size()) {
    run(0, chosen_experts.size());
  } else {
    kernels::ParallelFor(chosen_experts.size(), 1, run);
  }
  for (size_t k = 0; k < chosen_experts.size(); ++k) {
    const size_t e = chosen_experts[k];
    const float* weights = w.experts[e].weight_before_down ? nullptr : weights_of[e].data();
    AddRows(y.data() + y_row[k] * hidden, hidden, rows_of[e].size(), weights, rows_of[e].data(), out);
  }
  if (w.shared.inter > 0) SwiGluForward(w.shared, hidden, x, n, nullptr, nullptr, out);
}

size_t MoeWeightBytes(const MoeWeights& w, size_t experts_touched) {
  const auto swiglu = [](const SwiGluWeights& s) { return s.gate.bytes() + s.up.bytes() + s.down.bytes(); };
  const size_t per_expert = w.experts.empty() ? 0 : swiglu(w.experts[0]);
  return sizeof(float) * w.router.size() + experts_touched * per_expert + swiglu(w.shared);
}

}  // namespace kvtier::runtime
