// DeepSeek-V4's own rounding of activations (quantization-aware training):
// values go through FP8 or FP4 and straight back, in place, as its
// kernel.py act_quant and fp4_act_quant (inplace=True) do. The model's
// outputs depend on these roundings bit for bit, so they are part of its
// math, not a storage choice: a cache that keeps the rounded values keeps
// exactly what the model attends over.
#ifndef KVTIER_KERNELS_QAT_ROUNDING_H_
#define KVTIER_KERNELS_QAT_ROUNDING_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvtier::kernels {

// Each block of `block` values: scale = 2^ceil(log2(max(amax, 1e-4) *
// (1/448 as a float))) (a power of two, "ue8m0"), value = E4M3(value /
// scale) * scale, E4M3 rounded to nearest even. x.size() must be a
// multiple of block.
void RoundThroughFp8(std::span<float> x, size_t block);

// Each block of `block` values: scale = 2^ceil(log2(max(amax, 6 * 2^-126)
// * (1/6 as a float))), value = E2M1(value / scale) * scale, E2M1 (0, 0.5,
// 1, 1.5, 2, 3, 4, 6) rounded to nearest even. x.size() must be a multiple
// of block.
void RoundThroughFp4(std::span<float> x, size_t block);

// The E2M1 code (float_formats.h's E2m1ToFloat) nearest to v (|v| <= 6),
// ties to the even code; and its value.
uint8_t NearestE2m1Code(float v);
float RoundToE2m1(float v);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_QAT_ROUNDING_H_
