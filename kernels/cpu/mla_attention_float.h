// The float path of absorbed MLA attention (bf16, fp8 and int4 blocks, and
// int8 where the CPU lacks VNNI) over a block already widened to floats,
// in register tiles: with AVX-512 4 heads x 4 tokens for the scores, 4
// heads x 64 channels for the weighted sums, 16 sums in registers and each
// load shared by 4 FMAs; with AVX2 (16 registers of 8 floats) 4 heads x 3
// tokens and 4 heads x 16 channels. Private to kernels/cpu.
#ifndef KVTIER_KERNELS_CPU_MLA_ATTENTION_FLOAT_H_
#define KVTIER_KERNELS_CPU_MLA_ATTENTION_FLOAT_H_

#include <cstddef>
#include <cstdint>

namespace kvtier::kernels::cpu {

// False while a test has turned the attention kernels' tiles off
// (SetAttentionTilesForTesting), so that the portable paths run.
bool AttentionTilesEnabled();

// True when this CPU runs AVX-512 (x86-64-v4) or AVX2 (x86-64-v3) and the
// shape suits the tiles (dim and kv_lora_rank multiples of 16).
bool FloatTilesUsable(uint32_t dim, uint32_t kv_lora_rank);

// scores[h * stride + t] = q[h] . rows[t] for t < tokens, h < heads
// (`rows` [tokens][dim] floats, or bf16 values, a bf16 block's payload as
// it lies; `q` [heads][dim]).
void FloatBlockScores(const float* rows, uint32_t tokens, uint32_t dim, uint32_t heads, const float* q, float* scores,
                      size_t stride);
void FloatBlockScores(const uint16_t* rows, uint32_t tokens, uint32_t dim, uint32_t heads, const float* q,
                      float* scores, size_t stride);

// out[h * kv + c] += sum_t p[h * stride + t] * rows[t][c] for c < kv.
void FloatBlockWeightedSum(const float* rows, uint32_t tokens, uint32_t dim, uint32_t kv, uint32_t heads,
                           const float* p, size_t stride, float* out);
void FloatBlockWeightedSum(const uint16_t* rows, uint32_t tokens, uint32_t dim, uint32_t kv, uint32_t heads,
                           const float* p, size_t stride, float* out);

// p[h * tokens + t] = q[h] . rows[t] (`rows` [tokens][dim] floats, `q`
// [heads][dim]): the register tiles where the CPU has them and the tests
// have not turned them off, else Gemm (each score Gemv's bits).
void RowScores(const float* rows, size_t tokens, uint32_t dim, uint32_t heads, const float* q, float* p);

// dst[h * kv + c] += sum_t p[h * tokens + t] * rows[t][c] for c < kv: the
// register tiles, else plain loops over 64 channels at a time.
void AddRowSums(const float* p, size_t tokens, uint32_t heads, const float* rows, uint32_t dim, uint32_t kv,
                float* dst);

// An fp8 block's tokens widened to floats, [tokens][kv + rope] (kv and rope
// multiples of 16): the same values as the codec's Fp8E4m3ToFloat times the
// tile's scale, NaN codes included.
void WidenFp8Block(const uint8_t* payload, uint32_t tokens, uint32_t kv, uint32_t rope, float* rows);

// An int4 block's codes (0..15) as floats, [tokens][dim] (dim a multiple
// of 32: each half of a token's channels a whole number of 16-byte runs).
void WidenInt4Codes(const uint8_t* payload, uint32_t tokens, uint32_t dim, float* rows);

}  // namespace kvtier::kernels::cpu

#endif  // KVTIER_KERNELS_CPU_MLA_ATTENTION_FLOAT_H_
