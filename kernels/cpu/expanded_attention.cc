#include "kvtier/kernels/expanded_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "avx512.h"
#include "codec_internal.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/parallel.h"
#include "lanes16.h"
#include "mla_attention_float.h"

namespace kvtier::kernels {
namespace {

// out[j] += p * v[j] for a value row.
KVTIER_VECTOR_CLONES void AddScaled(float p, const float* v, size_t n, float* out) {
  for (size_t j = 0; j < n; ++j) out[j] += p * v[j];
}

// AbsorbQueries for heads [begin, end), a weight row at a time for all
// rows: the path of CPUs without AVX-512.
void AbsorbHeadsPortable(const MlaDims& d, const float* w_uk, const float* q, std::span<const size_t> rows,
                         float* q_latent, size_t begin, size_t end) {
  const size_t qdim = d.nope + d.rope;
  for (size_t h = begin; h < end; ++h) {
    for (size_t r : rows) std::fill_n(q_latent + (r * d.heads + h) * d.kv, d.kv, 0.0f);
    for (size_t i = 0; i < d.nope; ++i) {
      const float* w = w_uk + (h * d.nope + i) * d.kv;
      for (size_t r : rows) AddScaled(q[(r * d.heads + h) * qdim + i], w, d.kv, q_latent + (r * d.heads + h) * d.kv);
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
using cpu::Lanes16;
using cpu::Load16;

// y[m][c] = sum_i x[m][i] * w[i][c] for M rows, each output summed in i
// order with one FMA a step, as AddScaled sums it (the same bits): the
// rows share every load of w, 32 channels at a time in registers (AddScaled
// reloads and stores a row's outputs for every i). AVX-512 only: in AVX2's
// registers GCC built the broadcasts through memory.
template <size_t M>
KVTIER_AVX512 inline void AbsorbRows(const float* w, size_t nope, size_t kv, const float* const x[M],
                                     float* const y[M]) {
  size_t c0 = 0;
  for (; c0 + 32 <= kv; c0 += 32) {
    Lanes16 acc[M][2] = {};
    for (size_t i = 0; i < nope; ++i) {
      const Lanes16 w0 = Load16(w + i * kv + c0), w1 = Load16(w + i * kv + c0 + 16);
      for (size_t m = 0; m < M; ++m) acc[m][0] += x[m][i] * w0, acc[m][1] += x[m][i] * w1;
    }
    for (size_t m = 0; m < M; ++m) {
      std::memcpy(y[m] + c0, &acc[m][0], sizeof acc[m][0]);
      std::memcpy(y[m] + c0 + 16, &acc[m][1], sizeof acc[m][1]);
    }
  }
  for (size_t m = 0; m < M; ++m) {
    for (size_t c = c0; c < kv; ++c) {
      float s = 0.0f;
      for (size_t i = 0; i < nope; ++i) s += x[m][i] * w[i * kv + c];
      y[m][c] = s;
    }
  }
}

// AbsorbQueries for heads [begin, end), the rows 4 at a time.
KVTIER_AVX512 void AbsorbHeadsAvx512(const MlaDims& d, const float* w_uk, const float* q, std::span<const size_t> rows,
                                     float* q_latent, size_t begin, size_t end) {
  const size_t qdim = d.nope + d.rope;
  for (size_t h = begin; h < end; ++h) {
    const float* w = w_uk + h * d.nope * d.kv;
    size_t k = 0;
    for (; k + 4 <= rows.size(); k += 4) {
      const float* x[4];
      float* y[4];
      for (size_t m = 0; m < 4; ++m) {
        x[m] = q + (rows[k + m] * d.heads + h) * qdim;
        y[m] = q_latent + (rows[k + m] * d.heads + h) * d.kv;
      }
      AbsorbRows<4>(w, d.nope, d.kv, x, y);
    }
    for (; k < rows.size(); ++k) {
      const float* x[1] = {q + (rows[k] * d.heads + h) * qdim};
      float* y[1] = {q_latent + (rows[k] * d.heads + h) * d.kv};
      AbsorbRows<1>(w, d.nope, d.kv, x, y);
    }
  }
}
#else
// No AVX-512 build of the rows here (HasAvx512 may still say the CPU has
// it): the portable path, never a stub that leaves q_latent unwritten.
void AbsorbHeadsAvx512(const MlaDims& d, const float* w_uk, const float* q, std::span<const size_t> rows,
                       float* q_latent, size_t begin, size_t end) {
  AbsorbHeadsPortable(d, w_uk, q, rows, q_latent, begin, end);
}
#endif

}  // namespace

void AbsorbQueries(const MlaDims& d, const float* w_uk, const float* q, std::span<const size_t> rows, float* q_latent) {
  const bool tiles = cpu::HasAvx512() && cpu::AttentionTilesEnabled();
  ParallelFor(d.heads, 1, [&](size_t begin, size_t end) {
    if (tiles) {
      AbsorbHeadsAvx512(d, w_uk, q, rows, q_latent, begin, end);
    } else {
      AbsorbHeadsPortable(d, w_uk, q, rows, q_latent, begin, end);
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
        Softmax(pi, seen, scale);
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
