#include "kvtier/kernels/qat_rounding.h"

#include <algorithm>
#include <cmath>

#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels {
namespace {

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

uint8_t NearestE2m1Code(float v) {
  const float a = std::fabs(v);
  // The grid's step is 0.5 below 2 (codes 0-4), 1 below 4 (4-6), 2 up to
  // 6 (6-7); nearbyint rounds half to even, and an even multiple of the
  // step is an even code.
  const int index = a < 2.0f   ? static_cast<int>(std::nearbyint(a * 2.0f))
                    : a < 4.0f ? 2 + static_cast<int>(std::nearbyint(a))
                               : 4 + static_cast<int>(std::nearbyint(a / 2.0f));
  return static_cast<uint8_t>((std::signbit(v) ? 8 : 0) | index);
}

float RoundToE2m1(float v) { return E2m1ToFloat(NearestE2m1Code(v)); }

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
