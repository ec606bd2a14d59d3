// The int8 blocks' part of absorbed MLA attention with integer dot
// products: AVX-512 VNNI's vpdpwssd (32 multiply-adds an instruction,
// against 16 for a float FMA) or, without it, AVX2's vpmaddwd (16, and an
// add). Codes stay int8, widened to int16; the query (with the block's
// channel scales folded in) and the attention weights are rounded to int16
// with one float scale per head and block, so each product is exact in
// int32 and only those two roundings (relative 2^-16 of the largest value)
// differ from the float path. The block's 4 widest channels are multiplied
// in float, so that an outlier channel does not coarsen the query's
// rounding. Private to kernels/cpu.
#ifndef KVTIER_KERNELS_CPU_MLA_ATTENTION_INT8_H_
#define KVTIER_KERNELS_CPU_MLA_ATTENTION_INT8_H_

#include <cstddef>
#include <cstdint>

namespace kvtier::kernels::cpu {

// True when this CPU runs AVX-512 (x86-64-v4) with VNNI or AVX2 (x86-64-v3)
// and the shape suits the kernels: dim a multiple of 32, kv_lora_rank of
// 16, dim at most 8192 (VNNI) or 4096 (AVX2: int32 sums of 8 lanes).
bool Int8IntegerUsable(uint32_t dim, uint32_t kv_lora_rank);

// scores[h * stride + t] = q[h] . (scale * code_t) for the block's tokens:
// `q` is [heads][dim] floats, `payload` an int8 block of `tokens` tokens.
void Int8BlockScores(const uint8_t* payload, uint32_t tokens, uint32_t dim, uint32_t heads, const float* q,
                     float* scores, size_t stride);

// out[h * kv + c] += sum_t p[h * stride + t] * scale_c * code_tc for the
// latent channels c < kv.
void Int8BlockWeightedSum(const uint8_t* payload, uint32_t tokens, uint32_t dim, uint32_t kv, uint32_t heads,
                          const float* p, size_t stride, float* out);

}  // namespace kvtier::kernels::cpu

#endif  // KVTIER_KERNELS_CPU_MLA_ATTENTION_INT8_H_
