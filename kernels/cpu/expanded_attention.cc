#include "kvtier/kernels/expanded_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "codec_internal.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/parallel.h"

namespace kvtier::kernels {
namespace {

// out[j] += p * v[j] for a value row.
KVTIER_VECTOR_CLONES void AddScaled(float p, const float* v, size_t n, float* out) {
  for (size_t j = 0; j < n; ++j) out[j] += p * v[j];
}

}  // namespace

void AbsorbQueries(const MlaDims& d, const float* w_uk, const float* q, std::span<const size_t> rows,
                   float* q_latent) {
  const size_t qdim = d.nope + d.rope;
  ParallelFor(d.heads, 1, [&](size_t begin, size_t end) {
    for (size_t h = begin; h < end; ++h) {
      for (size_t r : rows) std::fill_n(q_latent + (r * d.heads + h) * d.kv, d.kv, 0.0f);
      for (size_t i = 0; i < d.nope; ++i) {
        const float* w = w_uk + (h * d.nope + i) * d.kv;
        for (size_t r : rows) AddScaled(q[(r * d.heads + h) * qdim + i], w, d.kv, q_latent + (r * d.heads + h) * d.kv);
      }
    }
  });
}

MlaCosts MlaFormCosts(const MlaDims& d, size_t rows, size_t context, size_t visible) {
  const double h = static_cast<double>(d.heads), per_token_weights = static_cast<double>((d.nope + d.v) * d.kv);
  return {static_cast<double>(rows) * h * per_token_weights + static_cast<double>(visible) * h * (2 * d.kv + d.rope),
          static_cast<double>(context) * h * per_token_weights +
              static_cast<double>(visible) * h * (d.nope + d.rope + d.v)};
}

void ExpandedAttention(const MlaDims& d, const float* w_uk, const float* w_uv, std::span<const float> context,
                       size_t rows, const int64_t* positions, const float* q, const float* q_pe, float scale,
                       float* out) {
  const size_t dim = d.kv + d.rope, tokens = context.size() / dim, qdim = d.nope + d.rope;
  // Keys and values per head: [heads][tokens][nope], [heads][tokens][v].
  std::vector<float> keys(d.heads * tokens * d.nope), values(d.heads * tokens * d.v);
  for (size_t h = 0; h < d.heads; ++h) {
    Gemm(w_uk + h * d.nope * d.kv, d.nope, d.kv, context.data(), tokens, dim, keys.data() + h * tokens * d.nope,
         d.nope);
    Gemm(w_uv + h * d.v * d.kv, d.v, d.kv, context.data(), tokens, dim, values.data() + h * tokens * d.v, d.v);
  }
  // Rows are independent: the kernel threads take them in chunks.
  ParallelFor(rows, 8, [&](size_t row_begin, size_t row_end) {
    std::vector<float> score(tokens), pe(tokens * d.heads);
    for (size_t r = row_begin; r < row_end; ++r) {
      const size_t seen = static_cast<size_t>(positions[r]) + 1;
      // Rope scores of every head at once: pe[t][h] = q_pe[h] . pe_t.
      Gemm(q_pe + r * d.heads * d.rope, d.heads, d.rope, context.data() + d.kv, seen, dim, pe.data(), d.heads);
      for (size_t h = 0; h < d.heads; ++h) {
        Gemm(q + (r * d.heads + h) * qdim, 1, d.nope, keys.data() + h * tokens * d.nope, seen, d.nope, score.data(),
             1);
        float max = -INFINITY;
        for (size_t t = 0; t < seen; ++t) max = std::max(max, score[t] = (score[t] + pe[t * d.heads + h]) * scale);
        float sum = 0.0f;
        for (size_t t = 0; t < seen; ++t) sum += (score[t] = std::exp(score[t] - max));
        float* o = out + (r * d.heads + h) * d.v;
        std::fill(o, o + d.v, 0.0f);
        const float* vh = values.data() + h * tokens * d.v;
        for (size_t t = 0; t < seen; ++t) AddScaled(score[t] / sum, vh + t * d.v, d.v, o);
      }
    }
  });
}

}  // namespace kvtier::kernels
