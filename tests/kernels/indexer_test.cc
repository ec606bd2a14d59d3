// DeepSeek-V3.2's lightning indexer pieces against references written
// plainly, in double, from the definitions (deepseek_math.h for FP8): the Hadamard matrix entry
// by entry, the FP8 rounding by searching every E4M3 value, the scores as
// the formula reads. Fresh random inputs every run.
#include "kvtier/kernels/indexer.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <utility>

#include "kvtier/kernels/rope.h"
#include "tests/reference/deepseek_math.h"
#include "tests/test_random.h"

namespace kvtier::kernels {
namespace {

TEST(Indexer, HadamardRotateIsTheScaledSylvesterMatrix) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t n : {1, 2, 8, 128}) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng.engine());
    std::vector<double> want(n, 0.0);
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) want[i] += (std::popcount(i & j) % 2 ? -1.0 : 1.0) * x[j] / std::sqrt(double(n));
    }
    ASSERT_TRUE(HadamardRotate(x).ok());
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(x[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << n << " at " << i;
  }
  std::vector<float> twelve(12);
  EXPECT_EQ(HadamardRotate(twelve).code(), StatusCode::kInvalidArgument);
}

TEST(Indexer, Fp8RoundingHasPowerOfTwoScalesAndNearestCodes) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> magnitude(-12.0f, 6.0f);
  constexpr size_t kGroup = 32;
  std::vector<float> x(6 * kGroup);
  for (size_t g = 0; g < 6; ++g) {
    const float spread = std::exp2(magnitude(rng.engine()));
    for (size_t i = 0; i < kGroup; ++i) x[g * kGroup + i] = spread * normal(rng.engine());
  }
  for (size_t i = 0; i < kGroup; ++i) x[4 * kGroup + i] = 1e-6f * normal(rng.engine());  // amax under 1e-4
  x[5 * kGroup] = 448.0f * 4;  // amax exactly 448 x 2^2: the scale is 4, not 8
  std::vector<uint8_t> codes(x.size());
  std::vector<float> scales(6);
  ASSERT_TRUE(QuantizeIndexerFp8(x, kGroup, codes, scales).ok());
  for (size_t g = 0; g < 6; ++g) {
    double amax = 1e-4;
    for (size_t i = 0; i < kGroup; ++i) amax = std::max(amax, std::fabs(double(x[g * kGroup + i])));
    const double want_scale = std::exp2(std::ceil(std::log2(double(float(amax)) / 448.0)));
    ASSERT_EQ(scales[g], want_scale) << "group " << g;
    for (size_t i = 0; i < kGroup; ++i) {
      ASSERT_EQ(codes[g * kGroup + i], ReferenceNearestE4m3(x[g * kGroup + i] / want_scale))
          << "group " << g << " value " << i;
    }
  }
  EXPECT_EQ(scales[5], 4.0f);
  EXPECT_EQ(codes[5 * kGroup], 0x7e) << "448, the largest code";
  std::vector<float> bad_scales(5);
  EXPECT_EQ(QuantizeIndexerFp8(x, kGroup, codes, bad_scales).code(), StatusCode::kInvalidArgument);
}

TEST(Indexer, ScoresAreWeightedReluDotsTimesTheKeyScale) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> positive(0.01f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr uint32_t kHeads = 4, kDim = 16, kTokens = 9;
  auto code = [&] {
    uint8_t c;
    do c = static_cast<uint8_t>(byte(rng.engine()));
    while ((c & 0x7f) == 0x7f || ((c >> 3) & 0xf) > 9);  // no NaN; values up to 2^2 keep dots moderate
    return c;
  };
  std::vector<uint8_t> q(kHeads * kDim), keys(kTokens * kDim);
  for (uint8_t& c : q) c = code();
  for (uint8_t& c : keys) c = code();
  std::vector<float> weights(kHeads), key_scales(kTokens), scores(kTokens);
  for (float& w : weights) w = normal(rng.engine());
  for (float& s : key_scales) s = positive(rng.engine());
  ASSERT_TRUE(IndexerScores(kHeads, kDim, q, weights, keys, key_scales, scores).ok());
  for (uint32_t s = 0; s < kTokens; ++s) {
    double want = 0;
    for (uint32_t h = 0; h < kHeads; ++h) {
      double dot = 0;
      for (uint32_t d = 0; d < kDim; ++d)
        dot += ReferenceE4m3Value(q[h * kDim + d]) * ReferenceE4m3Value(keys[s * kDim + d]);
      want += weights[h] * std::max(dot, 0.0);
    }
    want *= key_scales[s];
    EXPECT_NEAR(scores[s], want, 1e-4 * (1 + std::fabs(want))) << "token " << s;
  }
  std::vector<float> short_scores(kTokens - 1);
  EXPECT_EQ(IndexerScores(kHeads, kDim, q, weights, keys, key_scales, short_scores).code(),
            StatusCode::kInvalidArgument);
}

// V4's scores against the formula in float64, at key counts below, at and
// past the 256 keys it scores at a time, with a head dim that takes the
// register tiles (32) and one that takes Gemm (24).
TEST(Indexer, V4ScoresAreWeightedReluDots) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const uint32_t heads = 5;
  for (const auto& [dim, count] : {std::pair<uint32_t, size_t>{32, 1}, {32, 256}, {32, 600}, {24, 600}}) {
    std::vector<float> q(heads * dim), weights(heads), keys(count * dim), scores(count, NAN);
    for (float& v : q) v = normal(rng.engine());
    for (float& v : weights) v = normal(rng.engine());
    for (float& v : keys) v = normal(rng.engine());
    V4IndexerScores(heads, dim, q.data(), weights.data(), keys.data(), count, scores.data());
    for (size_t g = 0; g < count; ++g) {
      double want = 0, magnitude = 0;
      for (uint32_t h = 0; h < heads; ++h) {
        double dot = 0;
        for (uint32_t d = 0; d < dim; ++d) dot += double{q[h * dim + d]} * keys[g * dim + d];
        want += std::max(dot, 0.0) * weights[h];
        magnitude += std::fabs(dot * weights[h]);
      }
      ASSERT_NEAR(scores[g], want, 1e-5 * (1 + magnitude)) << "dim " << dim << ", " << count << " keys, at " << g;
    }
  }
}

TEST(Indexer, TopTokensHighestFirstTiesToTheLowerIndex) {
  const std::vector<float> scores = {0.5f, 2.0f, -1.0f, 2.0f, 0.5f, 3.0f};
  std::vector<uint32_t> top;
  SelectTopTokens(scores, 4, top);
  EXPECT_EQ(top, (std::vector<uint32_t>{5, 1, 3, 0}));
  SelectTopTokens(scores, 10, top);
  EXPECT_EQ(top.size(), scores.size()) << "a context no longer than k: every token";
  EXPECT_EQ(top.back(), 2u);
}

// The indexer's RoPE rotates halves ([x_0..x_{d/2-1} | x_{d/2}..]), with no
// de-interleaving: DeepSeek's first demo interleaved it, which was a bug.
TEST(Indexer, RopeOnHalvesRotatesEachPairAcrossTheHalves) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  RopeTable rope;
  ASSERT_TRUE(RopeTable::Create(8, 10000.0, nullptr, rope).ok());
  std::vector<float> x(8);
  for (float& v : x) v = normal(rng.engine());
  const std::vector<float> before = x;
  const int64_t position = 37;
  rope.ApplyHalves(position, x);
  for (size_t i = 0; i < 4; ++i) {
    const double angle = position / std::pow(10000.0, 2.0 * i / 8);
    EXPECT_NEAR(x[i], before[i] * std::cos(angle) - before[4 + i] * std::sin(angle), 1e-5);
    EXPECT_NEAR(x[4 + i], before[4 + i] * std::cos(angle) + before[i] * std::sin(angle), 1e-5);
  }
}

}  // namespace
}  // namespace kvtier::kernels
