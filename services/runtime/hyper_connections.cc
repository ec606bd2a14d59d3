#include "services/runtime/hyper_connections.h"

#include <algorithm>
#include <cmath>

#include "kvtier/kernels/layers.h"

namespace kvtier::runtime {
namespace {

float Sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// mixes[n][rows] = (x_row . fn_r) / rms(x_row), x's copies flattened.
std::vector<float> Mixes(const HcParams& p, const HcShape& s, const float* x, size_t n, size_t rows) {
  const size_t width = s.hc * s.hidden;
  std::vector<float> mixes(n * rows);
  kernels::Gemm(p.fn.data(), rows, width, x, n, width, mixes.data(), rows);
  for (size_t r = 0; r < n; ++r) {
    double squares = 0;
    for (size_t i = 0; i < width; ++i) squares += double{x[r * width + i]} * x[r * width + i];
    const float inverse_rms = 1.0f / std::sqrt(static_cast<float>(squares / width) + s.norm_eps);
    for (size_t m = 0; m < rows; ++m) mixes[r * rows + m] *= inverse_rms;
  }
  return mixes;
}

// out[hidden] = sum_j pre[j] * x[j].
void Reduce(const float* pre, const HcShape& s, const float* x, float* out) {
  for (size_t i = 0; i < s.hidden; ++i) {
    float sum = 0;
    for (size_t j = 0; j < s.hc; ++j) sum += pre[j] * x[j * s.hidden + i];
    out[i] = sum;
  }
}

// comb: a softmax over each row, then alternately normalized over columns
// and rows (Sinkhorn), columns first and last.
void Sinkhorn(const HcShape& s, float* comb) {
  const size_t hc = s.hc;
  const auto normalize_columns = [&] {
    for (size_t k = 0; k < hc; ++k) {
      float sum = 0;
      for (size_t j = 0; j < hc; ++j) sum += comb[j * hc + k];
      for (size_t j = 0; j < hc; ++j) comb[j * hc + k] /= sum + s.eps;
    }
  };
  for (size_t j = 0; j < hc; ++j) {
    kernels::Softmax(comb + j * hc, hc);
    for (size_t k = 0; k < hc; ++k) comb[j * hc + k] += s.eps;
  }
  normalize_columns();
  for (int it = 1; it < s.sinkhorn_iters; ++it) {
    for (size_t j = 0; j < hc; ++j) {
      float sum = 0;
      for (size_t k = 0; k < hc; ++k) sum += comb[j * hc + k];
      for (size_t k = 0; k < hc; ++k) comb[j * hc + k] /= sum + s.eps;
    }
    normalize_columns();
  }
}

}  // namespace

void HcPre(const HcParams& p, const HcShape& s, const float* x, size_t n, std::vector<HcWeights>& weights, float* out) {
  const size_t hc = s.hc, rows = (2 + hc) * hc;
  const std::vector<float> mixes = Mixes(p, s, x, n, rows);
  weights.resize(n);
  for (size_t r = 0; r < n; ++r) {
    const float* m = mixes.data() + r * rows;
    HcWeights& w = weights[r];
    w.pre.resize(hc);
    w.post.resize(hc);
    w.comb.resize(hc * hc);
    for (size_t j = 0; j < hc; ++j) {
      w.pre[j] = Sigmoid(m[j] * p.scale[0] + p.base[j]) + s.eps;
      w.post[j] = 2.0f * Sigmoid(m[hc + j] * p.scale[1] + p.base[hc + j]);
    }
    for (size_t i = 0; i < hc * hc; ++i) w.comb[i] = m[2 * hc + i] * p.scale[2] + p.base[2 * hc + i];
    Sinkhorn(s, w.comb.data());
    Reduce(w.pre.data(), s, x + r * hc * s.hidden, out + r * s.hidden);
  }
}

void HcPost(const HcShape& s, const std::vector<HcWeights>& weights, const float* branch, size_t n, float* x) {
  const size_t hc = s.hc, hidden = s.hidden;
  std::vector<float> mixed(hc * hidden);
  for (size_t r = 0; r < n; ++r) {
    const HcWeights& w = weights[r];
    float* copies = x + r * hc * hidden;
    for (size_t k = 0; k < hc; ++k) {
      for (size_t i = 0; i < hidden; ++i) {
        float sum = w.post[k] * branch[r * hidden + i];
        for (size_t j = 0; j < hc; ++j) sum += w.comb[j * hc + k] * copies[j * hidden + i];
        mixed[k * hidden + i] = sum;
      }
    }
    std::copy(mixed.begin(), mixed.end(), copies);
  }
}

void HcHead(const HcParams& p, const HcShape& s, const float* x, size_t n, float* out) {
  const std::vector<float> mixes = Mixes(p, s, x, n, s.hc);
  std::vector<float> pre(s.hc);
  for (size_t r = 0; r < n; ++r) {
    for (size_t j = 0; j < s.hc; ++j) pre[j] = Sigmoid(mixes[r * s.hc + j] * p.scale[0] + p.base[j]) + s.eps;
    Reduce(pre.data(), s, x + r * s.hc * s.hidden, out + r * s.hidden);
  }
}

}  // namespace kvtier::runtime
