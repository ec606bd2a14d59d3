#include "services/runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kvtier/kernels/parallel.h"
#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

std::vector<float> NormalLogits(size_t n, float stddev, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> logits(n);
  for (float& v : logits) v = normal(rng);
  return logits;
}

TEST(Sampler, GreedyTakesTheArgmaxWithItsLogSoftmax) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const std::vector<float> logits = NormalLogits(300, 3.0f, rng.engine());
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

// The order a full stable sort gives: most likely first, ties by id.
std::vector<uint32_t> ReferenceOrder(const std::vector<float>& logits) {
  std::vector<uint32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return logits[a] > logits[b]; });
  return order;
}

// A vocabulary with many ties (logits on a coarse grid) at real size:
// greedy takes the first of the largest, and the top list is the stable
// order's head.
TEST(Sampler, GreedyAndTopLogprobsFollowTheStableOrderAtFullVocabulary) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::uniform_int_distribution<int> grid(-40, 40);
  std::vector<float> logits(102400);
  for (float& v : logits) v = static_cast<float>(grid(rng.engine())) / 4;
  const std::vector<uint32_t> order = ReferenceOrder(logits);
  const Sampled s = Sample(logits, Sampling{}, 0, 20);
  EXPECT_EQ(s.token, order[0]);
  ASSERT_EQ(s.top.size(), 20u);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(s.top[i].first, order[i]) << i;
  double sum = 0;
  for (float v : logits) sum += std::exp(double{v} - 10.0);
  EXPECT_NEAR(s.logprob, logits[order[0]] - 10.0 - std::log(sum), 1e-4);
}

// A large vocabulary with a peaked head: draws stay inside the nucleus a
// full sort gives (the smallest head reaching top_p), at the frequencies of
// their renormalised probabilities; with top_p 1 any token can come.
TEST(Sampler, NucleusDrawsMatchAFullSortAtLargeVocabulary) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::vector<float> logits = NormalLogits(4000, 1.0f, rng.engine());
  // A head of 60 tokens at random ids, logits 4.0 to 5.18.
  std::vector<uint32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0u);
  std::shuffle(ids.begin(), ids.end(), rng.engine());
  for (int i = 0; i < 60; ++i) logits[ids[i]] = 4.0f + 0.02f * static_cast<float>(i);
  const Sampling sampling{0.8f, 0.5f, rng.engine()()};
  const std::vector<uint32_t> order = ReferenceOrder(logits);
  const double max = logits[order[0]];
  std::vector<double> p(logits.size());
  double total = 0;
  for (uint32_t t : order) total += (p[t] = std::exp((logits[t] - max) / 0.8));
  size_t keep = 0;
  double mass = 0;
  while (mass < 0.5 * total) mass += p[order[keep++]];
  const std::set<uint32_t> nucleus(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep));
  ASSERT_GT(keep, 10u);  // enough tokens for the frequencies to mean something
  std::map<uint32_t, int> count;
  constexpr int kDraws = 20000;
  for (uint64_t step = 0; step < kDraws; ++step) {
    const uint32_t t = Sample(logits, sampling, step, 0).token;
    // The last kept token sits on the cut, where float and double sums may
    // disagree: the one after it is allowed too.
    ASSERT_TRUE(nucleus.count(t) || t == order[keep]) << "token " << t << " outside the nucleus";
    ++count[t];
  }
  for (size_t i = 0; i < 3; ++i) {
    const uint32_t t = order[i];
    EXPECT_NEAR(count[t] / double{kDraws}, p[t] / mass, 0.006) << "token " << t;
  }
  std::set<uint32_t> drawn_wide;
  for (uint64_t step = 0; step < 1000; ++step)
    drawn_wide.insert(Sample(logits, Sampling{0.8f, 1.0f, 3}, step, 0).token);
  EXPECT_GT(drawn_wide.size(), keep) << "top_p 1 keeps the whole vocabulary";
}

// Logits the model should never give (it fails a pass that overflows)
// still sample a token of the vocabulary.
TEST(Sampler, NonFiniteLogitsStillGiveATokenOfTheVocabulary) {
  for (const std::vector<float>& logits :
       {std::vector<float>{NAN, 1.0f, 2.0f}, std::vector<float>{1.0f, NAN, 0.5f},
        std::vector<float>{INFINITY, 1.0f, 2.0f}, std::vector<float>{NAN, NAN, NAN}}) {
    for (const Sampling& s : {Sampling{}, Sampling{1.0f, 1.0f, 1}, Sampling{1.0f, 0.5f, 1}}) {
      EXPECT_LT(Sample(logits, s, 0, 2).token, logits.size());
    }
  }
}

// A decode step's tokens drawn together over the kernel threads: each the
// token, log-probability and alternatives Sample gives alone, whatever the
// thread count; greedy and temperature rows mixed.
TEST(Sampler, SampleEachGivesEachRowWhatSampleGives) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const std::vector<Sampling> samplings = {Sampling{}, Sampling{0.8f, 0.9f, 11}, Sampling{1.0f, 1.0f, 12}};
  std::vector<std::vector<float>> logits;
  std::vector<SampleRequest> requests;
  for (size_t i = 0; i < 11; ++i) logits.push_back(NormalLogits(4000, 3.0f, rng.engine()));
  for (size_t i = 0; i < logits.size(); ++i) requests.push_back({logits[i], &samplings[i % 3], 5 + i, i % 4});
  for (size_t threads : {1, 3}) {
    kernels::SetKernelThreads(threads);
    const std::vector<Sampled> got = SampleEach(requests);
    kernels::SetKernelThreads(1);
    ASSERT_EQ(got.size(), requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const Sampled want = Sample(logits[i], *requests[i].sampling, requests[i].step, requests[i].top_n);
      EXPECT_EQ(got[i].token, want.token) << "row " << i << ", " << threads << " threads";
      EXPECT_EQ(got[i].logprob, want.logprob) << "row " << i;
      EXPECT_EQ(got[i].top, want.top) << "row " << i;
    }
  }
  EXPECT_TRUE(SampleEach({}).empty());
}

TEST(Sampler, RejectsBadParameters) {
  for (const Sampling ok : {Sampling{}, Sampling{0.0f, 1.0f, 0}, Sampling{100.0f, 1e-6f, 0}}) {
    EXPECT_TRUE(ValidateSampling(ok).ok()) << ok.temperature << " " << ok.top_p;
  }
  for (const float temperature : {-1.0f, NAN, INFINITY, 100.5f}) {
    const absl::Status s = ValidateSampling(Sampling{temperature, 1.0f, 0});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << temperature;
    EXPECT_EQ(s.message(), "temperature must be in [0, 100]") << temperature;
  }
  for (const float top_p : {0.0f, -0.5f, NAN, 1.5f}) {
    const absl::Status s = ValidateSampling(Sampling{1.0f, top_p, 0});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << top_p;
    EXPECT_EQ(s.message(), "top_p must be in (0, 1]") << top_p;
  }
}

}  // namespace
}  // namespace kvtier::runtime
