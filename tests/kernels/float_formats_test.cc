// The narrow-format conversions against float64 references: exhaustive over
// all FP8 codes, randomized over floats for rounding.
#include "kvtier/kernels/float_formats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/test_random.h"

namespace kvtier::kernels {
namespace {

// E4M3FN value of a code, computed from the OCP definition in double.
double Fp8Reference(int code) {
  const int sign = (code >> 7) & 1, exponent = (code >> 3) & 0xf, mantissa = code & 7;
  if ((code & 0x7f) == 0x7f) return std::numeric_limits<double>::quiet_NaN();
  const double mag = exponent == 0 ? std::ldexp(mantissa / 8.0, -6) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -mag : mag;
}

// Nearest code by exhaustive search, ties to the even mantissa, saturating.
int Fp8NearestReference(double x) {
  int best = -1;
  double best_err = INFINITY;
  for (int code = 0; code < 256; ++code) {
    const double v = Fp8Reference(code);
    if (std::isnan(v) || (std::signbit(v) != std::signbit(x))) continue;
    const double err = std::fabs(v - x);
    if (err < best_err || (err == best_err && (code & 1) == 0)) {
      best = code;
      best_err = err;
    }
  }
  return best;
}

TEST(Fp8, DecodesEveryCodeLikeTheSpec) {
  for (int code = 0; code < 256; ++code) {
    const double want = Fp8Reference(code);
    const float got = Fp8E4m3ToFloat(static_cast<uint8_t>(code));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << code;
    } else {
      EXPECT_EQ(got, want) << "code " << code;
    }
  }
  EXPECT_EQ(Fp8E4m3ToFloat(0x7e), 448.0f);
}

TEST(Fp8, EncodesEveryRepresentableValueToItsCode) {
  for (int code = 0; code < 256; ++code) {
    const float v = Fp8E4m3ToFloat(static_cast<uint8_t>(code));
    if (std::isnan(v) || code == 0x80) continue;  // -0 encodes as 0x80 too, checked below
    EXPECT_EQ(FloatToFp8E4m3(v), code) << "value " << v;
  }
  EXPECT_EQ(FloatToFp8E4m3(-0.0f), 0x80);
}

TEST(Fp8, RoundsToNearestEvenOnRandomValues) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::uniform_real_distribution<double> exponent(-12.0, 8.9);
  std::bernoulli_distribution negative(0.5);
  for (int i = 0; i < 20000; ++i) {
    float x = static_cast<float>(std::exp2(exponent(rng.engine())));
    if (negative(rng.engine())) x = -x;
    ASSERT_EQ(FloatToFp8E4m3(x), Fp8NearestReference(x)) << "x = " << x;
  }
  // Exact midpoints go to the even code.
  for (int code = 1; code < 0x7e; ++code) {
    const double mid = (Fp8Reference(code) + Fp8Reference(code + 1)) / 2;
    const int want = (code & 1) == 0 ? code : code + 1;
    ASSERT_EQ(FloatToFp8E4m3(static_cast<float>(mid)), want) << "midpoint after " << code;
  }
}

TEST(Fp8, SaturatesAndKeepsNan) {
  EXPECT_EQ(FloatToFp8E4m3(1e9f), 0x7e);
  EXPECT_EQ(FloatToFp8E4m3(-500.0f), 0xfe);
  EXPECT_EQ(FloatToFp8E4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
}

TEST(Bf16, RoundsToNearestEvenAgainstFloat64) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 100000; ++i) {
    const float x = BitsToFloat(bits(rng.engine()));
    if (!std::isfinite(x)) continue;
    const float y = Bf16ToFloat(FloatToBf16(x));
    // Neighbours of x in bf16: truncate, and truncate + 1 ulp (same sign).
    const uint32_t t = FloatBits(x) & 0xffff0000u;
    const double lo = BitsToFloat(t), hi = BitsToFloat(t + 0x10000u);
    // Past the largest bf16 the upper neighbour is inf; IEEE rounds as if it
    // were 2^128 (one more step of the same exponent).
    const double hi_at = std::isinf(hi) ? std::copysign(0x1p128, x) : hi;
    const double dlo = std::fabs(x - lo), dhi = std::fabs(hi_at - x);
    double want = dlo < dhi ? lo : (dhi < dlo ? hi : (((t >> 16) & 1) ? hi : lo));
    ASSERT_EQ(static_cast<double>(y), want) << "x = " << x;
  }
}

TEST(Bf16, DirectedRoundingsBracketTheValue) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = normal(rng.engine());
    const float up = Bf16ToFloat(FloatToBf16TowardPositive(x));
    const float down = Bf16ToFloat(FloatToBf16TowardNegative(x));
    ASSERT_GE(up, x);
    ASSERT_LE(down, x);
    ASSERT_LE(static_cast<double>(up) - down, std::fabs(x) * std::exp2(-7.0)) << x;
  }
  EXPECT_EQ(Bf16ToFloat(FloatToBf16TowardPositive(1.5f)), 1.5f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16TowardNegative(-1.5f)), -1.5f);
}

}  // namespace
}  // namespace kvtier::kernels
