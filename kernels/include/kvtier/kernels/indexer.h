// DeepSeek-V3.2's lightning indexer (DeepSeek Sparse Attention), CPU: the
// rotation and FP8 rounding of its queries and keys, the score a query
// gives each earlier token, and the top-k choice of tokens MLA then
// attends to. As DeepSeek-V3.2-Exp's inference code computes them
// (model.py Indexer, kernel.py act_quant and fp8_index). A token's key
// (codes and scale) is what a cache must keep beside its latent: it cannot
// be recomputed from the latent.
#ifndef KVTIER_KERNELS_INDEXER_H_
#define KVTIER_KERNELS_INDEXER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/kernels/status.h"

namespace kvtier::kernels {

// x <- H x / sqrt(n), H the Sylvester Hadamard matrix (H_1 = [1],
// H_2n = [[H_n, H_n], [H_n, -H_n]]), by the fast Walsh-Hadamard transform.
// n = x.size() must be a power of two.
Status HadamardRotate(std::span<float> x);

// The indexer's FP8 rounding of queries and keys: for each group of
// `group` values, scale = 2^ceil(log2(max(amax, 1e-4) / 448)) (a power of
// two, "ue8m0") and codes = E4M3(x / scale), rounded to nearest even (the
// division is exact). DeepSeek's groups are 128 values: one a head of a
// query, one a key. x.size() must be a multiple of group.
Status QuantizeIndexerFp8(std::span<const float> x, size_t group, std::span<uint8_t> codes, std::span<float> scales);

// The score query q gives each of `tokens` cached keys:
//   score[s] = key_scales[s] * sum_h weights[h] * ReLU(q_h . k_s)
// over the FP8 codes' values (q_codes [heads][head_dim], key_codes
// [tokens][head_dim], one scale a key). `weights` carry the rest of the
// formula: weights_proj(x)_h * heads^-0.5 * q's scale of head h *
// head_dim^-0.5. The dot products go through Gemm, over the kernel threads;
// a token's score does not depend on the thread count.
Status IndexerScores(uint32_t heads, uint32_t head_dim, std::span<const uint8_t> q_codes,
                     std::span<const float> weights, std::span<const uint8_t> key_codes,
                     std::span<const float> key_scales, std::span<float> scores);

// DeepSeek-V4's indexer: the score one query gives each of `count`
// compressed keys (keys [count][dim], rounded by the model to FP4 and held
// as floats): score[g] = sum_h weights[h] * ReLU(q_h . k_g), heads added in
// order; q [heads][dim], weights [heads] (carrying the scales).
void V4IndexerScores(uint32_t heads, uint32_t dim, const float* q, const float* weights, const float* keys,
                     size_t count, float* scores);

// The min(k, scores.size()) tokens of highest score, highest first, ties
// to the lower index.
void SelectTopTokens(std::span<const float> scores, size_t k, std::vector<uint32_t>& out);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_INDEXER_H_
