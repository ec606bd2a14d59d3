#include "kvtier/kernels/sink_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvtier/kernels/layers.h"

namespace kvtier::kernels {

void SinkAttention(const SinkAttentionShape& shape, const float* q, const float* entries, size_t count,
                   const float* sinks, float* out) {
  const size_t heads = shape.heads, dim = shape.dim, m = count;
  if (m == 0) {
    std::fill_n(out, heads * dim, 0.0f);
    return;
  }
  std::vector<float> scores(heads * m), transposed(dim * m);
  Gemm(entries, m, dim, q, heads, dim, scores.data(), m);
  for (size_t e = 0; e < m; ++e) {
    for (size_t i = 0; i < dim; ++i) transposed[i * m + e] = entries[e * dim + i];
  }
  for (size_t h = 0; h < heads; ++h) {
    float* s = scores.data() + h * m;
    float top = -INFINITY;
    for (size_t e = 0; e < m; ++e) top = std::max(top, s[e] * shape.scale);
    float sum = 0;
    for (size_t e = 0; e < m; ++e) sum += s[e] = std::exp(s[e] * shape.scale - top);
    const float denominator = sum + std::exp(sinks[h] - top);
    for (size_t e = 0; e < m; ++e) s[e] /= denominator;
  }
  Gemm(transposed.data(), dim, m, scores.data(), heads, m, out, dim);
}

}  // namespace kvtier::kernels
