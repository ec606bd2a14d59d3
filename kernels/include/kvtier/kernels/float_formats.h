// Bit-exact conversions between float32 and the narrow formats the codecs
// store: bfloat16 and OCP FP8 E4M3FN (the "fn" variant: no infinities, one
// NaN pattern per sign, max 448); and the MX formats' E8M0 scales and E2M1
// codes DeepSeek-V4 publishes. Header-only so the CUDA backend can share
// the exact same rounding rules.
#ifndef KVTIER_KERNELS_FLOAT_FORMATS_H_
#define KVTIER_KERNELS_FLOAT_FORMATS_H_

#include <bit>
#include <cstdint>

// Host and device: the CUDA kernels call these very functions.
#if defined(__CUDACC__)
#define KVTIER_HD __host__ __device__
#else
#define KVTIER_HD
#endif

namespace kvtier::kernels {

KVTIER_HD inline uint32_t FloatBits(float f) { return std::bit_cast<uint32_t>(f); }
KVTIER_HD inline float BitsToFloat(uint32_t u) { return std::bit_cast<float>(u); }

KVTIER_HD inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(uint32_t{h} << 16); }

// `condition ? a : b` as bit operations: loops that use it stay branch-free,
// so compilers vectorize them.
KVTIER_HD inline uint32_t SelectBits(bool condition, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (a & mask) | (b & ~mask);
}

// The bf16 nearest to a non-NaN float (ties to even), as its 16 bits; beyond
// the bf16 range it is +-inf.
KVTIER_HD inline uint32_t RoundToBf16Bits(uint32_t float_bits) {
  return (float_bits + 0x7fffu + ((float_bits >> 16) & 1u)) >> 16;
}

// Round to nearest, ties to even. NaN stays NaN (quiet); values beyond the
// bf16 range become +-inf, as IEEE rounding demands.
KVTIER_HD inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? (u >> 16) | 0x0040u : RoundToBf16Bits(u));
}

// Directed roundings for finite input, used for quantization scales and zero
// points so the stored (rounded) value still covers the data's range.
KVTIER_HD inline uint16_t FloatToBf16TowardPositive(float f) {
  const uint32_t u = FloatBits(f);
  uint16_t h = static_cast<uint16_t>(u >> 16);
  const bool inexact = (u & 0xffffu) != 0;
  const bool negative = (u >> 31) != 0;
  if (inexact && !negative) ++h;  // magnitude up for positives
  return h;                       // truncation already rounds negatives up
}
KVTIER_HD inline uint16_t FloatToBf16TowardNegative(float f) {
  const uint32_t u = FloatBits(f);
  uint16_t h = static_cast<uint16_t>(u >> 16);
  const bool inexact = (u & 0xffffu) != 0;
  const bool negative = (u >> 31) != 0;
  if (inexact && negative) ++h;  // magnitude up for negatives
  return h;
}

inline constexpr float kFp8E4m3Max = 448.0f;

// Round to nearest, ties to even, for finite |f| < 464 (where no saturation
// is needed): what the fp8 codec feeds after scaling. Any other input gives
// an unspecified code without undefined behaviour. Written with selects
// instead of branches so loops over it vectorize.
KVTIER_HD inline uint8_t Fp8E4m3FromInRange(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  // Below 2^-6 the codes are subnormal multiples of 2^-9: adding and
  // subtracting 2^14 rounds to one (ties to even). Clamping the bits to 2^-6
  // keeps the conversion to integer in range for every input.
  const float small = BitsToFloat(a < 0x3c800000u ? a : 0x3c800000u);
  const uint32_t subnormal = static_cast<uint32_t>(static_cast<int32_t>(((small + 16384.0f) - 16384.0f) * 512.0f));
  // Normal: keep 3 mantissa bits, ties to even, and rebias the exponent 127 -> 7.
  const uint32_t normal = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  return static_cast<uint8_t>(sign | SelectBits(a < 0x3c800000u, subnormal, normal));
}

// Any float: as above, saturating to +-448 from 464 (the tie of 448 and the
// absent 480) up; NaN becomes the E4M3FN NaN 0x7f.
KVTIER_HD inline uint8_t FloatToFp8E4m3(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  // Out of range the first conversion is garbage but well defined; replaced.
  const uint32_t in_range = Fp8E4m3FromInRange(f);
  uint32_t code = SelectBits(a >= 0x43e80000u, sign | 0x7eu, in_range);
  code = SelectBits(a > 0x7f800000u, sign | 0x7fu, code);
  return static_cast<uint8_t>(code);
}

// The power of two at or above v (a positive normal float), exactly, on
// its bits: the "ue8m0" scales DeepSeek's FP8 and FP4 roundings use.
KVTIER_HD inline float PowerOfTwoAtLeast(float v) {
  uint32_t u = FloatBits(v);
  if ((u & 0x7fffffu) != 0) u = (u & 0x7f800000u) + 0x800000u;
  return BitsToFloat(u);
}

// FlashMLA's FP8 tile scale, 2^ceil(log2(max(amax / 448, 1e-4))), computed
// exactly on the float's bits.
KVTIER_HD inline float Fp8TileScale(float amax) {
  const float ratio = amax / kFp8E4m3Max;
  return PowerOfTwoAtLeast(ratio > 1e-4f ? ratio : 1e-4f);
}

// Branch-free as well: a normal code's 7 exponent-and-mantissa bits placed at
// float bit 20 give its value once the exponent is rebiased (+120); a
// subnormal code is its mantissa times 2^-9.
KVTIER_HD inline float Fp8E4m3ToFloat(uint8_t c) {
  const uint32_t magnitude = c & 0x7fu;
  const uint32_t normal = (magnitude << 20) + (120u << 23);
  const uint32_t subnormal = FloatBits(static_cast<float>(static_cast<int32_t>(c & 0x7u)) * (1.0f / 512.0f));
  uint32_t bits = SelectBits(magnitude < 0x08u, subnormal, normal);
  bits = SelectBits(magnitude == 0x7fu, 0x7fc00000u, bits);
  return BitsToFloat(bits | (uint32_t{c & 0x80u} << 24));
}

// An E8M0 scale byte (MX formats): 2^(byte - 127); 0xff is NaN.
inline float E8m0ToFloat(uint8_t byte) {
  return byte == 0xff ? BitsToFloat(0x7fc00000u) : (byte == 0 ? 0x1p-127f : BitsToFloat(uint32_t{byte} << 23));
}

// An E2M1 (FP4) code's value: a sign bit over the index of its magnitude
// in 0, 0.5, 1, 1.5, 2, 3, 4, 6.
inline float E2m1ToFloat(uint8_t code) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[code & 0xf];
}

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_FLOAT_FORMATS_H_
