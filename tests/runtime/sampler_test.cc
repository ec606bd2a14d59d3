#include "services/runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

TEST(Sampler, GreedyTakesTheArgmaxWithItsLogSoftmax) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(300);
  for (float& v : logits) v = normal(rng.engine());
  const Sampled s = Sample(logits, Sampling{}, 0, 5);
  const size_t argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  EXPECT_EQ(s.token, argmax);
  double sum = 0;
  for (float v : logits) sum += std::exp(double{v});
  EXPECT_NEAR(s.logprob, logits[argmax] - std::log(sum), 1e-5);
  ASSERT_EQ(s.top.size(), 5u);
  EXPECT_EQ(s.top[0].first, argmax);
  for (size_t i = 1; i < 5; ++i) {
    EXPECT_LE(s.top[i].second, s.top[i - 1].second);
    EXPECT_NEAR(s.top[i].second, logits[s.top[i].first] - std::log(sum), 1e-5);
  }
}

TEST(Sampler, TemperatureDrawsFollowTheDistributionAndTopPCutsTheTail) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  auto frequencies = [&](const Sampling& s) {
    std::vector<int> count(3, 0);
    for (uint64_t step = 0; step < 20000; ++step) ++count[Sample(logits, s, step, 0).token];
    return std::vector<double>{count[0] / 20000.0, count[1] / 20000.0, count[2] / 20000.0};
  };
  const auto full = frequencies(Sampling{1.0f, 1.0f, 42});
  EXPECT_NEAR(full[0], 0.5, 0.02);
  EXPECT_NEAR(full[1], 0.3, 0.02);
  EXPECT_NEAR(full[2], 0.2, 0.02);
  const auto nucleus = frequencies(Sampling{1.0f, 0.7f, 42});  // 0.5 + 0.3 reaches 0.7
  EXPECT_EQ(nucleus[2], 0.0);
  EXPECT_NEAR(nucleus[0], 0.625, 0.02);
  const auto narrow = frequencies(Sampling{1.0f, 0.1f, 42});
  EXPECT_EQ(narrow[0], 1.0);
  // Reproducible from (seed, step); the logprob ignores temperature.
  const Sampled a = Sample(logits, Sampling{0.7f, 1.0f, 9}, 3, 2);
  const Sampled b = Sample(logits, Sampling{0.7f, 1.0f, 9}, 3, 2);
  EXPECT_EQ(a.token, b.token);
  EXPECT_NEAR(a.logprob, logits[a.token], 1e-6);
}

TEST(Sampler, RejectsBadParameters) {
  EXPECT_TRUE(ValidateSampling(Sampling{}).ok());
  EXPECT_FALSE(ValidateSampling(Sampling{-1.0f, 1.0f, 0}).ok());
  EXPECT_FALSE(ValidateSampling(Sampling{NAN, 1.0f, 0}).ok());
  EXPECT_FALSE(ValidateSampling(Sampling{1.0f, 0.0f, 0}).ok());
  EXPECT_FALSE(ValidateSampling(Sampling{1.0f, 1.5f, 0}).ok());
}

}  // namespace
}  // namespace kvtier::runtime
