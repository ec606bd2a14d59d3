#include "kvtier/kernels/sink_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvtier/kernels/layers.h"
#include "mla_attention_float.h"
#include "scratch.h"

namespace kvtier::kernels {

void SinkAttention(const SinkAttentionShape& shape, const float* q, const float* entries, size_t count,
                   const float* sinks, float* out) {
  const size_t heads = shape.heads, dim = shape.dim, m = count;
  std::fill_n(out, heads * dim, 0.0f);
  if (m == 0) return;
  // Kept per thread between calls (this runs for every layer of every row).
  thread_local std::vector<float> scores_buffer;
  float* scores = cpu::Sized(scores_buffer, heads * m);
  cpu::RowScores(entries, m, shape.dim, shape.heads, q, scores);
  for (size_t h = 0; h < heads; ++h) {  // the softmax's one chunk, then the sink in its denominator
    float* s = scores + h * m;
    float top = -INFINITY, sum = 0.0f;
    SoftmaxChunk(s, m, shape.scale, top, sum);
    const float inverse = 1.0f / (sum + std::exp(sinks[h] - top));
    for (size_t e = 0; e < m; ++e) s[e] *= inverse;
  }
  cpu::AddRowSums(scores, m, shape.heads, entries, shape.dim, shape.dim, out);
}

}  // namespace kvtier::kernels
