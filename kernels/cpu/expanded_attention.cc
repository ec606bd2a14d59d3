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
  // The context's latents apart (Gemm reads a weight as contiguous rows);
  // keys per head [heads][tokens][nope + rope], each the head's expanded
  // key then the token's rope part, so that a score is one dot product
  // with [q_nope | q_pe] (as two, of 128 and 64, most of the work was the
  // dot products' lane sums); values per head transposed, [heads][v][tokens],
  // so that both products below are Gemms over a block of rows.
  std::vector<float> latents(tokens * d.kv);
  for (size_t t = 0; t < tokens; ++t) std::copy_n(context.data() + t * dim, d.kv, latents.data() + t * d.kv);
  std::vector<float> keys(d.heads * tokens * qdim), values_t(d.heads * d.v * tokens);
  for (size_t h = 0; h < d.heads; ++h) {
    float* kh = keys.data() + h * tokens * qdim;
    Gemm(w_uk + h * d.nope * d.kv, d.nope, d.kv, latents.data(), tokens, d.kv, kh, qdim);
    for (size_t t = 0; t < tokens; ++t) std::copy_n(context.data() + t * dim + d.kv, d.rope, kh + t * qdim + d.nope);
    Gemm(latents.data(), tokens, d.kv, w_uv + h * d.v * d.kv, d.v, d.kv, values_t.data() + h * d.v * tokens, tokens);
  }
  // Each (head, block of rows) is one job for the kernel threads: scores for
  // the block's rows at once (the keys read once for all of them), softmax
  // per row over the tokens it sees, then the weighted values.
  constexpr size_t kRowBlock = 32;
  const size_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  ParallelFor(d.heads * blocks, 1, [&](size_t job_begin, size_t job_end) {
    std::vector<float> p(kRowBlock * tokens), queries(kRowBlock * qdim), out_t(d.v * kRowBlock);
    for (size_t job = job_begin; job < job_end; ++job) {
      const size_t h = job / blocks, r0 = job % blocks * kRowBlock, n = std::min(kRowBlock, rows - r0);
      size_t seen_max = 0;
      for (size_t i = 0; i < n; ++i) {
        seen_max = std::max(seen_max, static_cast<size_t>(positions[r0 + i]) + 1);
        const size_t row = (r0 + i) * d.heads + h;
        std::copy_n(q + row * qdim, d.nope, queries.data() + i * qdim);
        std::copy_n(q_pe + row * d.rope, d.rope, queries.data() + i * qdim + d.nope);
      }
      // p[i][t] = [q_nope | q_pe]_i . [k | pe]_t for t < seen_max.
      Gemm(keys.data() + h * tokens * qdim, seen_max, qdim, queries.data(), n, qdim, p.data(), seen_max);
      for (size_t i = 0; i < n; ++i) {
        float* pi = p.data() + i * seen_max;
        const size_t seen = static_cast<size_t>(positions[r0 + i]) + 1;
        for (size_t t = 0; t < seen; ++t) pi[t] *= scale;
        Softmax(pi, seen);
        std::fill(pi + seen, pi + seen_max, 0.0f);  // tokens after this row's own
      }
      // out_t[j][i] = sum_t p[i][t] v_t[j]: the block's outputs, transposed.
      Gemm(p.data(), n, seen_max, values_t.data() + h * d.v * tokens, d.v, tokens, out_t.data(), n);
      for (size_t i = 0; i < n; ++i) {
        float* o = out + ((r0 + i) * d.heads + h) * d.v;
        for (size_t j = 0; j < d.v; ++j) o[j] = out_t[j * n + i];
      }
    }
  });
}

}  // namespace kvtier::kernels
