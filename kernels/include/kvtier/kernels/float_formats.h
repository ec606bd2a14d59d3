// Bit-exact conversions between float32 and the narrow formats the codecs
// store: bfloat16 and OCP FP8 E4M3FN (the "fn" variant: no infinities, one
// NaN pattern per sign, max 448). Header-only so the CUDA backend can share
// the exact same rounding rules.
#ifndef KVTIER_KERNELS_FLOAT_FORMATS_H_
#define KVTIER_KERNELS_FLOAT_FORMATS_H_

#include <bit>
#include <cstdint>

namespace kvtier::kernels {

inline uint32_t FloatBits(float f) { return std::bit_cast<uint32_t>(f); }
inline float BitsToFloat(uint32_t u) { return std::bit_cast<float>(u); }

inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(uint32_t{h} << 16); }

// Round to nearest, ties to even. NaN stays NaN (quiet); values beyond the
// bf16 range become +-inf, as IEEE rounding demands.
inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Directed roundings for finite input, used for quantization scales and zero
// points so the stored (rounded) value still covers the data's range.
inline uint16_t FloatToBf16TowardPositive(float f) {
  const uint32_t u = FloatBits(f);
  uint16_t h = static_cast<uint16_t>(u >> 16);
  const bool inexact = (u & 0xffffu) != 0;
  const bool negative = (u >> 31) != 0;
  if (inexact && !negative) ++h;  // magnitude up for positives
  return h;                        // truncation already rounds negatives up
}
inline uint16_t FloatToBf16TowardNegative(float f) {
  const uint32_t u = FloatBits(f);
  uint16_t h = static_cast<uint16_t>(u >> 16);
  const bool inexact = (u & 0xffffu) != 0;
  const bool negative = (u >> 31) != 0;
  if (inexact && negative) ++h;  // magnitude up for negatives
  return h;
}

inline constexpr float kFp8E4m3Max = 448.0f;

// Round to nearest, ties to even; saturates to +-448 (the codecs never feed
// it larger magnitudes); NaN becomes the E4M3FN NaN 0x7f.
inline uint8_t FloatToFp8E4m3(float f) {
  const uint32_t u = FloatBits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;
  const float mag = BitsToFloat(a);
  if (mag >= 464.0f) return sign | 0x7e;  // 464 is the tie between 448 and 480
  if (mag < 0.015625f) {  // below 2^-6: subnormal, step 2^-9
    // Adding and subtracting 2^23 * 2^-9 rounds to a multiple of 2^-9 (RNE).
    const float r = (mag + 16384.0f) - 16384.0f;
    return sign | static_cast<uint8_t>(r * 512.0f);
  }
  // Normal: keep 3 mantissa bits with round-to-nearest-even, rebias 127 -> 7.
  const uint32_t rounded = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
  return sign | static_cast<uint8_t>(rounded - (120u << 3));
}

inline float Fp8E4m3ToFloat(uint8_t c) {
  const uint32_t exponent = (c >> 3) & 0xfu;
  const uint32_t mantissa = c & 0x7u;
  float mag;
  if ((c & 0x7f) == 0x7f) {
    mag = BitsToFloat(0x7fc00000u);
  } else if (exponent == 0) {
    mag = static_cast<float>(mantissa) * (1.0f / 512.0f);
  } else {
    mag = BitsToFloat(((exponent + 120u) << 23) | (mantissa << 20));
  }
  return (c & 0x80) ? -mag : mag;
}

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_FLOAT_FORMATS_H_
