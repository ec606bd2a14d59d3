#include "kvtier/kernels/qat_rounding.h"

#include <algorithm>
#include <cmath>

#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels {
namespace {

// The power of two at or above v (a positive normal float), on its bits.
float PowerOfTwoAtLeast(float v) {
  uint32_t bits = FloatBits(v);
  if ((bits & 0x7fffffu) != 0) bits = (bits & 0x7f800000u) + 0x800000u;
  return BitsToFloat(bits);
}

float BlockAmax(std::span<const float> values, float floor) {
  float amax = floor;
  for (float v : values) amax = std::max(amax, std::fabs(v));
  return amax;
}

}  // namespace

void RoundThroughFp8(std::span<float> x, size_t block) {
  constexpr float kInverseMax = 1.0f / kFp8E4m3Max;
  for (size_t b = 0; b + block <= x.size(); b += block) {
    const std::span<float> values = x.subspan(b, block);
    const float scale = PowerOfTwoAtLeast(BlockAmax(values, 1e-4f) * kInverseMax);
    for (float& v : values) {
      // Dividing by a power of two is exact; the clamp keeps E4M3 finite.
      const float q = std::clamp(v / scale, -kFp8E4m3Max, kFp8E4m3Max);
      v = Fp8E4m3ToFloat(FloatToFp8E4m3(q)) * scale;
    }
  }
}

float RoundToE2m1(float v) {
  const float a = std::fabs(v);
  // The grid's step is 0.5 below 2, 1 below 4, 2 up to 6; nearbyint rounds
  // half to even, and an even multiple of the step is an even code.
  const float step = a < 2.0f ? 0.5f : (a < 4.0f ? 1.0f : 2.0f);
  return std::copysign(std::nearbyint(a / step) * step, v);
}

void RoundThroughFp4(std::span<float> x, size_t block) {
  constexpr float kInverseMax = 1.0f / 6.0f;
  const float floor = 6.0f * std::ldexp(1.0f, -126);
  for (size_t b = 0; b + block <= x.size(); b += block) {
    const std::span<float> values = x.subspan(b, block);
    const float scale = PowerOfTwoAtLeast(BlockAmax(values, floor) * kInverseMax);
    for (float& v : values) v = RoundToE2m1(std::clamp(v / scale, -6.0f, 6.0f)) * scale;
  }
}

}  // namespace kvtier::kernels
