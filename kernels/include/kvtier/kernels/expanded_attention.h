// MLA attention for passes with many rows of one sequence (prefill), in the
// expanded form: the sequence's latents are expanded once per pass into
// per-head keys and values (k_nope = W_UK c, v = W_UV c), then each row
// attends with qk_nope + rope dims (192 for V2) and v dims (128) instead of
// the absorbed form's 576 and 512. The same math (q.W_UK c = (W_UK^T q).c);
// which form is cheaper depends on how many rows share the context, and
// MlaFormCosts says which.
#ifndef KVTIER_KERNELS_EXPANDED_ATTENTION_H_
#define KVTIER_KERNELS_EXPANDED_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvtier::kernels {

struct MlaDims {
  size_t heads, nope, rope, v, kv;
};

// Multiply-adds of one layer's attention for `rows` rows over a context of
// `context` tokens, where `visible` is the sum over rows of the tokens each
// sees: absorbed (query absorption and W_UV per row, 2*kv + rope per
// visible token and head) and expanded (W_UK and W_UV per context token,
// nope + rope + v per visible token and head).
struct MlaCosts {
  double absorbed, expanded;
};
MlaCosts MlaFormCosts(const MlaDims& d, size_t rows, size_t context, size_t visible);

// The absorbed form's query: W_UK folded in, q_latent[r][h] = sum_i
// q[r][h][i] * w_uk[h][i] over the nope dims, for the rows listed in `rows`
// (others are left alone). q: [row][heads][nope + rope]; w_uk: [heads]
// [nope][kv]; q_latent: [row][heads][kv]. Each weight row is read once for
// all rows; heads are split over the kernel threads, each output summed by
// one thread in a fixed order (the same bits for any thread count).
void AbsorbQueries(const MlaDims& d, const float* w_uk, const float* q, std::span<const size_t> rows, float* q_latent);

// For each row r and head h: softmax over t <= positions[r] of scale *
// (q_nope . W_UK[h] c_t + q_pe . pe_t), then out = sum_t p_t W_UV[h] c_t.
// context: [tokens][kv + rope] (latent c_t then rotated pe_t); q: [rows]
// [heads][nope + rope], of which the nope part is read; q_pe: [rows][heads]
// [rope], rotated; out: [rows][heads][v]; w_uk: [heads][nope][kv]; w_uv:
// [heads][v][kv]. Every position must be below the context's tokens.
// Scores and weighted values are Gemms over blocks of rows, (head, block)
// jobs split over the kernel threads: the same bits for any thread count.
void ExpandedAttention(const MlaDims& d, const float* w_uk, const float* w_uv, std::span<const float> context,
                       size_t rows, const int64_t* positions, const float* q, const float* q_pe, float scale,
                       float* out);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_EXPANDED_ATTENTION_H_
