#include "kvtier/kernels/sink_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kvtier/kernels/layers.h"
#include "mla_attention_float.h"
#include "scratch.h"

namespace kvtier::kernels {
namespace {

// SinkAttention's buffers, kept per thread between calls (it runs for every
// layer of every row).
struct SinkScratch {
  std::vector<float> scores, transposed;
};

SinkScratch& ThreadSinkScratch() {
  thread_local SinkScratch scratch;
  return scratch;
}

}  // namespace

void SinkAttention(const SinkAttentionShape& shape, const float* q, const float* entries, size_t count,
                   const float* sinks, float* out) {
  const size_t heads = shape.heads, dim = shape.dim, m = count;
  if (m == 0) {
    std::fill_n(out, heads * dim, 0.0f);
    return;
  }
  SinkScratch& scratch = ThreadSinkScratch();
  float* scores = cpu::Sized(scratch.scores, heads * m);
  // AVX2 or AVX-512 register tiles read the entries as they lie; elsewhere Gemm,
  // which takes the weighted sums over the entries transposed.
  const bool tiles = cpu::FloatTilesUsable(shape.dim, shape.dim) && m <= UINT32_MAX;
  if (tiles) {
    cpu::FloatBlockScores(entries, static_cast<uint32_t>(m), shape.dim, shape.heads, q, scores, m);
  } else {
    Gemm(entries, m, dim, q, heads, dim, scores, m);
  }
  for (size_t h = 0; h < heads; ++h) {  // the softmax's one chunk, then the sink in its denominator
    float* s = scores + h * m;
    float top = -INFINITY, sum = 0.0f;
    SoftmaxChunk(s, m, shape.scale, top, sum);
    const float inverse = 1.0f / (sum + std::exp(sinks[h] - top));
    for (size_t e = 0; e < m; ++e) s[e] *= inverse;
  }
  if (tiles) {
    std::fill_n(out, heads * dim, 0.0f);
    cpu::FloatBlockWeightedSum(entries, static_cast<uint32_t>(m), shape.dim, shape.dim, shape.heads, scores, m, out);
    return;
  }
  float* transposed = cpu::Sized(scratch.transposed, dim * m);
  for (size_t e = 0; e < m; ++e) {
    for (size_t i = 0; i < dim; ++i) transposed[i * m + e] = entries[e * dim + i];
  }
  Gemm(transposed, dim, m, scores, heads, m, out, dim);
}

}  // namespace kvtier::kernels
