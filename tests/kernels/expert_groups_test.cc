// The MoE pair layout (expert_groups.h) the CUDA MoE runs on: every index
// checked against the routing it was made from, and a layer computed
// through it on the CPU equal, bit for bit, to adding the experts' outputs
// one expert after another (what the GPU did before it used the layout).
#include "kvtier/kernels/expert_groups.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "tests/test_random.h"

namespace kvtier::kernels {
namespace {

constexpr uint32_t kTokens = 37, kRouted = 8, kTopK = 3, kHidden = 12;

// Routing like an MoE layer's: each token to kTopK distinct routed experts
// (random weights), then every token to a shared expert of weight 1.
struct Routing {
  std::vector<std::vector<int32_t>> rows;
  std::vector<std::vector<float>> weights;
  std::vector<uint32_t> inter;
};

Routing RandomRouting(std::mt19937_64& rng) {
  Routing r;
  r.rows.resize(kRouted + 1);
  r.weights.resize(kRouted + 1);
  for (uint32_t g = 0; g < kRouted; ++g) r.inter.push_back(5 + g % 3);
  r.inter.push_back(16);  // the shared expert, wider
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  std::vector<int32_t> experts(kRouted);
  std::iota(experts.begin(), experts.end(), 0);
  for (uint32_t t = 0; t < kTokens; ++t) {
    std::shuffle(experts.begin(), experts.end(), rng);
    for (uint32_t k = 0; k < kTopK; ++k) {
      r.rows[experts[k]].push_back(static_cast<int32_t>(t));
      r.weights[experts[k]].push_back(weight(rng));
    }
    r.rows[kRouted].push_back(static_cast<int32_t>(t));
    r.weights[kRouted].push_back(1.0f);
  }
  return r;
}

TEST(ExpertGroupsTest, EveryPairIsWhereTheRoutingPutsIt) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const Routing r = RandomRouting(rng.engine());
  ExpertGroups plan;
  ASSERT_TRUE(PlanExpertGroups(r.rows, r.weights, r.inter, kTokens, plan).ok());
  ASSERT_EQ(plan.pairs(), size_t{kTokens} * (kTopK + 1));
  size_t pair = 0, inner = 0;
  for (size_t g = 0; g < r.rows.size(); ++g) {
    EXPECT_EQ(plan.count[g], r.rows[g].size());
    EXPECT_EQ(plan.first_pair[g], pair);
    EXPECT_EQ(plan.first_inner[g], inner);
    for (size_t i = 0; i < r.rows[g].size(); ++i) EXPECT_EQ(plan.pair_token[pair + i], r.rows[g][i]);
    pair += r.rows[g].size();
    inner += r.rows[g].size() * r.inter[g];
  }
  EXPECT_EQ(plan.inner_values, inner);
  // Each token: its kTopK + 1 pairs, in group order, with their weights.
  ASSERT_EQ(plan.token_first.size(), kTokens + 1);
  for (uint32_t t = 0; t < kTokens; ++t) {
    ASSERT_EQ(plan.token_first[t + 1] - plan.token_first[t], static_cast<int32_t>(kTopK + 1)) << "token " << t;
    int32_t last_pair = -1;
    for (int32_t j = plan.token_first[t]; j < plan.token_first[t + 1]; ++j) {
      const int32_t p = plan.token_pairs[j];
      EXPECT_GT(p, last_pair);  // pairs grow with their groups
      last_pair = p;
      EXPECT_EQ(plan.pair_token[p], static_cast<int32_t>(t));
      const size_t g =
          std::upper_bound(plan.first_pair.begin(), plan.first_pair.end(), size_t(p)) - plan.first_pair.begin() - 1;
      EXPECT_EQ(plan.token_weights[j], r.weights[g][p - plan.first_pair[g]]);
    }
  }
}

// acc += w * y, one expression wherever the test sums (so both sides round
// alike whatever the compiler contracts).
void AddWeighted(float& acc, float w, float y) { acc += w * y; }

// A tiny expert: y = W2 silu(W1 x), W1 [inter][kHidden], W2 [kHidden][inter].
struct Expert {
  std::vector<float> w1, w2;
  uint32_t inter;
};

void Inner(const Expert& e, const float* x, float* h) {
  for (uint32_t j = 0; j < e.inter; ++j) {
    float s = 0.0f;
    for (uint32_t c = 0; c < kHidden; ++c) AddWeighted(s, e.w1[j * kHidden + c], x[c]);
    h[j] = s / (1.0f + std::exp(-s));
  }
}

void Outer(const Expert& e, const float* h, float* y) {
  for (uint32_t c = 0; c < kHidden; ++c) {
    float s = 0.0f;
    for (uint32_t j = 0; j < e.inter; ++j) AddWeighted(s, e.w2[c * e.inter + j], h[j]);
    y[c] = s;
  }
}

TEST(ExpertGroupsTest, ALayerThroughThePlanEqualsAddingExpertsOneAfterAnother) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const Routing r = RandomRouting(rng.engine());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng.engine());
    return v;
  };
  std::vector<Expert> experts;
  for (const uint32_t inter : r.inter) experts.push_back({random(inter * kHidden), random(kHidden * inter), inter});
  const std::vector<float> x = random(size_t{kTokens} * kHidden);

  // One expert after another, each adding into its tokens' rows.
  std::vector<float> want(x.size(), 0.0f), h(16), y(kHidden);
  for (size_t g = 0; g < experts.size(); ++g) {
    for (size_t i = 0; i < r.rows[g].size(); ++i) {
      const size_t t = static_cast<size_t>(r.rows[g][i]);
      Inner(experts[g], &x[t * kHidden], h.data());
      Outer(experts[g], h.data(), y.data());
      for (uint32_t c = 0; c < kHidden; ++c) AddWeighted(want[t * kHidden + c], r.weights[g][i], y[c]);
    }
  }

  // Through the plan, as the GPU runs it: gather, every group's inner values
  // in one buffer, every pair's output in another, then a sum per token.
  ExpertGroups plan;
  ASSERT_TRUE(PlanExpertGroups(r.rows, r.weights, r.inter, kTokens, plan).ok());
  std::vector<float> gathered(plan.pairs() * kHidden), inner(plan.inner_values, NAN),
      outputs(plan.pairs() * kHidden, NAN);
  for (size_t p = 0; p < plan.pairs(); ++p) {
    std::copy_n(&x[static_cast<size_t>(plan.pair_token[p]) * kHidden], kHidden, &gathered[p * kHidden]);
  }
  // Stage by stage, as the GPU's GEMMs run: overlapping groups would
  // overwrite each other's inner values before they are read.
  for (size_t g = 0; g < experts.size(); ++g) {
    for (uint32_t i = 0; i < plan.count[g]; ++i) {
      Inner(experts[g], &gathered[(plan.first_pair[g] + i) * kHidden],
            &inner[plan.first_inner[g] + size_t{i} * r.inter[g]]);
    }
  }
  for (size_t g = 0; g < experts.size(); ++g) {
    for (uint32_t i = 0; i < plan.count[g]; ++i) {
      Outer(experts[g], &inner[plan.first_inner[g] + size_t{i} * r.inter[g]],
            &outputs[(plan.first_pair[g] + i) * kHidden]);
    }
  }
  ASSERT_TRUE(std::none_of(inner.begin(), inner.end(), [](float v) { return std::isnan(v); })) << "a gap";
  std::vector<float> got(x.size(), NAN);
  for (uint32_t t = 0; t < kTokens; ++t) {
    for (uint32_t c = 0; c < kHidden; ++c) {
      float acc = 0.0f;
      for (int32_t j = plan.token_first[t]; j < plan.token_first[t + 1]; ++j) {
        AddWeighted(acc, plan.token_weights[j], outputs[size_t(plan.token_pairs[j]) * kHidden + c]);
      }
      got[size_t{t} * kHidden + c] = acc;
    }
  }
  EXPECT_EQ(got, want);
}

TEST(ExpertGroupsTest, ListsThatDisagreeAndTokensOutOfRangeAreRefused) {
  ExpertGroups plan;
  const std::vector<uint32_t> inter = {4, 4};
  EXPECT_EQ(PlanExpertGroups({{0, 1}, {1}}, {{0.5f, 0.5f}, {}}, inter, 2, plan).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanExpertGroups({{0, 1}, {1}}, {{0.5f, 0.5f}}, inter, 2, plan).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanExpertGroups({{0, 2}, {1}}, {{0.5f, 0.5f}, {1.0f}}, inter, 2, plan).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanExpertGroups({{-1}, {1}}, {{0.5f}, {1.0f}}, inter, 2, plan).code(), StatusCode::kInvalidArgument);
  // A group with no tokens is fine: it takes no pairs.
  ASSERT_TRUE(PlanExpertGroups({{}, {1, 0}}, {{}, {1.0f, 2.0f}}, inter, 2, plan).ok());
  EXPECT_EQ(plan.pairs(), 2u);
  EXPECT_EQ(plan.token_pairs, (std::vector<int32_t>{1, 0}));  // token 0's pair is the second
}

}  // namespace
}  // namespace kvtier::kernels
