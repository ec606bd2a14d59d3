// RoPE (plain and YaRN), RMSNorm and the MoE gate against float64
// re-implementations written from DeepSeek-V2's modeling code.
#include "kvtier/kernels/layers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <tuple>
#include <vector>

#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/parallel.h"
#include "kvtier/kernels/rope.h"
#include "tests/reference/deepseek_math.h"
#include "tests/test_random.h"

namespace kvtier::kernels {
namespace {

class RopeTest : public ::testing::Test {
 protected:
  std::vector<float> Random(size_t n) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng_.engine());
    return v;
  }
  testing::SeededRng rng_;
};

TEST_F(RopeTest, MatchesTheReferenceForPlainAndYarn) {
  SCOPED_TRACE(rng_.Trace());
  const YarnParams v2lite{40.0, 4096, 32.0, 1.0, 0.707, 0.707};
  const YarnParams unequal_mscale{4.0, 512, 32.0, 1.0, 1.0, 0.5};
  for (const YarnParams* yarn : {static_cast<const YarnParams*>(nullptr), &v2lite, &unequal_mscale}) {
    for (uint32_t dim : {8u, 64u}) {
      RopeTable table;
      ASSERT_TRUE(RopeTable::Create(dim, 10000.0, yarn, table).ok());
      for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{4095}, int64_t{100000}}) {
        std::vector<float> x = Random(dim);
        const std::vector<double> want = ReferenceRope(std::vector<double>(x.begin(), x.end()), pos, 10000.0, yarn);
        table.Apply(pos, x);
        for (uint32_t j = 0; j < dim; ++j) {
          ASSERT_NEAR(x[j], want[j], 2e-6 * (1 + std::fabs(want[j])))
              << "dim " << dim << " pos " << pos << " j " << j << (yarn ? " yarn" : "");
        }
      }
    }
  }
}

TEST_F(RopeTest, DeinterleavesBeforeRotating) {
  RopeTable table;
  ASSERT_TRUE(RopeTable::Create(4, 10000.0, nullptr, table).ok());
  std::vector<float> x = {1, 2, 3, 4};
  table.Apply(0, x);  // angle 0: only the reordering is left
  EXPECT_EQ(x, (std::vector<float>{1, 3, 2, 4}));
}

TEST_F(RopeTest, ScoresDependOnlyOnRelativePosition) {
  SCOPED_TRACE(rng_.Trace());
  RopeTable table;
  ASSERT_TRUE(RopeTable::Create(64, 10000.0, nullptr, table).ok());
  const std::vector<float> q = Random(64), k = Random(64);
  auto score = [&](int64_t m, int64_t n) {
    std::vector<float> a = q, b = k;
    table.Apply(m, a);
    table.Apply(n, b);
    return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
  };
  EXPECT_NEAR(score(10, 3), score(510, 503), 1e-3);
  EXPECT_NEAR(score(0, 0), std::inner_product(q.begin(), q.end(), k.begin(), 0.0), 1e-4);
}

TEST(Rope, RejectsBadParameters) {
  RopeTable table;
  EXPECT_EQ(RopeTable::Create(7, 10000.0, nullptr, table).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeTable::Create(8, 1.0, nullptr, table).code(), StatusCode::kInvalidArgument);
  const YarnParams bad{0.0, 4096, 32, 1, 1, 1};
  EXPECT_EQ(RopeTable::Create(8, 10000.0, &bad, table).code(), StatusCode::kInvalidArgument);
}

// Softmax against float64, at lengths around the 16-lane groups and with
// and without a scale: random scores with a wide spread, and a sweep of
// exp's argument from 0 to -100
// (each output within 1e-5 of its value; a wrong polynomial or ln 2 split
// is off by more).
TEST(Softmax, MatchesFloat64) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 8.0f);
  std::vector<std::vector<float>> cases;
  for (size_t n : {1, 7, 16, 33, 1000}) {
    cases.emplace_back(n);
    for (float& v : cases.back()) v = normal(rng.engine());
  }
  cases.emplace_back(10000);
  for (size_t i = 0; i < cases.back().size(); ++i) cases.back()[i] = -0.01f * static_cast<float>(i);
  for (const float scale : {1.0f, 0.0721688f}) {  // and attention's 1/sqrt(192)
    for (std::vector<float>& x : cases) {
      const double max = *std::max_element(x.begin(), x.end());
      double sum = 0;
      for (float v : x) sum += std::exp(scale * (double{v} - max));
      std::vector<float> got = x;
      Softmax(got.data(), got.size(), scale);
      for (size_t i = 0; i < x.size(); ++i) {
        const double want = std::exp(scale * (double{x[i]} - max)) / sum;
        ASSERT_NEAR(got[i], want, 1e-5 * want + 1e-38)
            << "scale " << scale << ", n " << x.size() << " at " << i << " (score " << x[i] << ")";
      }
    }
  }
}

// A softmax taken chunk by chunk, the earlier chunks' weights multiplied
// by each factor returned and all divided by the final sum at the end,
// against float64: random scores, and scores rising and falling through
// exp's range (rising, every chunk moves the largest score; without the
// factors or the sum's rescaling the weights are off by up to e^90). Each
// rescaling of a weight may add two roundings (the factor's and the
// product's, 2^-24 each), so the bound grows by that per factor applied.
TEST(SoftmaxChunk, ChunkByChunkMatchesFloat64) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 8.0f);
  std::vector<std::vector<float>> cases(1, std::vector<float>(1000));
  for (float& v : cases[0]) v = normal(rng.engine());
  cases.emplace_back(3000);
  for (size_t i = 0; i < cases.back().size(); ++i) cases.back()[i] = -0.03f * static_cast<float>(i);
  cases.emplace_back(cases.back().rbegin(), cases.back().rend());
  // Far below zero: a chunk's largest must come from its own scores alone
  // (a padding lane taken for one would shift every exp to 0).
  cases.emplace_back(1000);
  for (float& v : cases.back()) v = -2000.0f + normal(rng.engine());
  for (const float scale : {1.0f, 0.0721688f}) {
    for (const std::vector<float>& x : cases) {
      const double max = *std::max_element(x.begin(), x.end());
      double sum = 0;
      for (float v : x) sum += std::exp(scale * (double{v} - max));
      for (const size_t chunk : {size_t{1}, size_t{7}, size_t{16}, size_t{100}}) {
        std::vector<float> got = x;
        std::vector<int> rescaled(x.size(), 0);
        float running_max = -INFINITY, running_sum = 0.0f;
        for (size_t begin = 0; begin < got.size(); begin += chunk) {
          const size_t n = std::min(chunk, got.size() - begin);
          const float factor = SoftmaxChunk(got.data() + begin, n, scale, running_max, running_sum);
          for (size_t i = 0; i < begin && factor != 1.0f; ++i) got[i] *= factor, ++rescaled[i];
        }
        for (size_t i = 0; i < x.size(); ++i) {
          const double want = std::exp(scale * (double{x[i]} - max)) / sum;
          ASSERT_NEAR(got[i] / running_sum, want, (1e-5 + rescaled[i] * 0x1p-23) * want + 1e-38)
              << "scale " << scale << ", n " << x.size() << ", chunks of " << chunk << " at " << i;
        }
      }
    }
  }
}

TEST(Gemv, MatchesFloat64AtOddSizes) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto [rows, cols] : {std::pair<size_t, size_t>{1, 1}, {7, 15}, {33, 16}, {64, 2049}}) {
    std::vector<float> w(rows * cols), x(cols), y(rows, NAN);
    for (float& v : w) v = normal(rng.engine());
    for (float& v : x) v = normal(rng.engine());
    Gemv(w.data(), rows, cols, x.data(), y.data());
    for (size_t r = 0; r < rows; ++r) {
      double want = 0, mag = 0;
      for (size_t c = 0; c < cols; ++c)
        want += double{w[r * cols + c]} * x[c], mag += std::fabs(double{w[r * cols + c]} * x[c]);
      ASSERT_NEAR(y[r], want, 1e-6 * (1 + mag)) << rows << "x" << cols << " row " << r;
    }
  }
}

// Strided inputs and outputs (with padding that must stay untouched) and
// batch sizes around the tiles (below 4 inputs, rows r and r + half side
// by side, an odd row count leaving one alone; 4 inputs; from 4 inputs, 6
// weight rows over 1,024-column chunks, in blocks of 32 inputs); each
// output also equals Gemv's bits.
TEST(Gemm, MatchesFloat64AndGemvWithStrides) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto [rows, cols, n] : {std::tuple<size_t, size_t, size_t>{1, 1, 1},
                               {5, 17, 3},
                               {9, 64, 4},
                               {31, 2049, 9},
                               {6, 1024, 4},
                               {13, 3000, 38},
                               {20, 15, 7},
                               {40, 2049, 2}}) {
    const size_t xs = cols + 3, ys = rows + 2;
    std::vector<float> w(rows * cols), x(n * xs), y(n * ys, NAN), one(rows);
    for (float& v : w) v = normal(rng.engine());
    for (float& v : x) v = normal(rng.engine());
    Gemm(w.data(), rows, cols, x.data(), n, xs, y.data(), ys);
    for (size_t i = 0; i < n; ++i) {
      Gemv(w.data(), rows, cols, x.data() + i * xs, one.data());
      for (size_t r = 0; r < rows; ++r) {
        double want = 0, mag = 0;
        for (size_t c = 0; c < cols; ++c) {
          const double p = double{w[r * cols + c]} * x[i * xs + c];
          want += p, mag += std::fabs(p);
        }
        ASSERT_NEAR(y[i * ys + r], want, 1e-6 * (1 + mag)) << rows << "x" << cols << " input " << i;
        ASSERT_EQ(y[i * ys + r], one[r]) << "batch and single differ at input " << i << " row " << r;
      }
      for (size_t r = rows; r < ys; ++r) ASSERT_TRUE(std::isnan(y[i * ys + r])) << "padding written";
    }
  }
}

// bf16 weights, widened as they are read: the bits of Gemm over the widened
// weights, on one thread and split over several, strides and tails (cols
// past the last 16) included.
TEST(GemmBf16, SameBitsAsGemmOverTheWidenedWeights) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto [rows, cols, n] : {std::tuple<size_t, size_t, size_t>{1, 1, 1},
                               {5, 17, 3},
                               {9, 64, 4},
                               {31, 2049, 9},
                               {700, 1500, 1},
                               {301, 1500, 2},
                               {600, 333, 37}}) {
    const size_t xs = cols + 3, ys = rows + 2;
    std::vector<uint16_t> w(rows * cols);
    std::vector<float> widened(rows * cols), x(n * xs);
    for (size_t k = 0; k < w.size(); ++k) w[k] = FloatToBf16(normal(rng.engine())), widened[k] = Bf16ToFloat(w[k]);
    for (float& v : x) v = normal(rng.engine());
    for (size_t threads : {1, 3}) {
      SetKernelThreads(threads);
      std::vector<float> want(n * ys, NAN), got(n * ys, NAN);
      Gemm(widened.data(), rows, cols, x.data(), n, xs, want.data(), ys);
      GemmBf16(w.data(), rows, cols, x.data(), n, xs, got.data(), ys);
      SetKernelThreads(1);
      for (size_t k = 0; k < got.size(); ++k) {
        if (std::isnan(want[k])) {
          ASSERT_TRUE(std::isnan(got[k])) << "padding written at " << k;
        } else {
          ASSERT_EQ(got[k], want[k]) << rows << "x" << cols << " n " << n << ", " << threads << " threads, at " << k;
        }
      }
    }
  }
}

TEST(RmsNorm, MatchesFloat64) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(2048), w(2048), out(2048);
  for (float& v : x) v = normal(rng.engine());
  for (float& v : w) v = 1.0f + 0.1f * normal(rng.engine());
  ASSERT_TRUE(RmsNorm(x, w, 1e-6f, out).ok());
  double ms = 0;
  for (float v : x) ms += double{v} * v / x.size();
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = w[i] * (x[i] / std::sqrt(ms + 1e-6));
    ASSERT_NEAR(out[i], want, 1e-5 * (1 + std::fabs(want)));
  }
  std::vector<float> short_w(10);
  EXPECT_EQ(RmsNorm(x, short_w, 1e-6f, out).code(), StatusCode::kInvalidArgument);
}

TEST(MoeGate, RenormalisesOrScalesNeverBoth) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f};
  std::vector<ExpertChoice> out;
  GateParams p{.top_k = 2, .norm_topk_prob = true, .routed_scaling_factor = 16.0f};
  ASSERT_TRUE(SelectExperts(logits, p, out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].expert, 1u);
  EXPECT_EQ(out[1].expert, 3u);
  EXPECT_NEAR(out[0].weight + out[1].weight, 1.0, 1e-6) << "renormalised, not scaled";
  p.norm_topk_prob = false;
  ASSERT_TRUE(SelectExperts(logits, p, out).ok());
  const auto want = ReferenceGate(logits, p);
  EXPECT_NEAR(out[0].weight, want[0].second, 1e-6);
  EXPECT_GT(out[0].weight + out[1].weight, 10.0) << "scaled by routed_scaling_factor";
  // top_k 1 with norm_topk_prob: DeepSeek-V2 scales instead of renormalising.
  p.top_k = 1;
  p.norm_topk_prob = true;
  ASSERT_TRUE(SelectExperts(logits, p, out).ok());
  EXPECT_NEAR(out[0].weight, ReferenceGate(logits, p)[0].second, 1e-6);
  EXPECT_GT(out[0].weight, 1.0f);
}

TEST(MoeGate, GroupLimitedSkipsExpertsOfLosingGroups) {
  // 4 groups of 2. Group 2 holds the 3rd and 4th best experts overall, but
  // its best is below groups 0 and 1's: with topk_group 2 it is excluded.
  const std::vector<float> logits = {3.0f, -5.0f, 2.9f, -5.0f, 2.8f, 2.8f, -5.0f, -5.0f};
  std::vector<ExpertChoice> out;
  GateParams p{.top_k = 3, .group_limited = true, .n_group = 4, .topk_group = 2};
  ASSERT_TRUE(SelectExperts(logits, p, out).ok());
  std::vector<uint32_t> chosen;
  for (auto& c : out) chosen.push_back(c.expert);
  EXPECT_EQ(chosen, (std::vector<uint32_t>{0, 2, 1})) << "expert 1 (group 0) beats 4 and 5";
  p.group_limited = false;
  ASSERT_TRUE(SelectExperts(logits, p, out).ok());
  EXPECT_EQ(out[2].expert, 4u) << "plain greedy takes group 2's expert";
}

// Whether the best `count` of `values` (and the one after them) hold two
// closer than float arithmetic can order (1e-6 apart): the gate in float
// and the reference in double may then rank them either way, both right.
bool NearTieAtTheTop(std::vector<double> values, size_t count) {
  std::sort(values.begin(), values.end(), std::greater<double>());
  for (size_t i = 1; i <= count && i < values.size(); ++i) {
    if (values[i - 1] - values[i] < 1e-6) return true;
  }
  return false;
}

// Whether the reference ranked near-tied values where float cannot follow
// double: among the experts it took (and the next), or among the groups it
// kept (and the next).
bool NearTie(const GateRanking& ranking, const GateParams& p) {
  return NearTieAtTheTop(ranking.experts, p.top_k) || NearTieAtTheTop(ranking.groups, p.topk_group);
}

TEST(MoeGate, RandomCasesMatchTheReference) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  int near_ties = 0;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_int_distribution<int> coin(0, 1);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<float> logits(64);
    for (float& v : logits) v = normal(rng.engine());
    GateParams p{.top_k = 6,
                 .group_limited = coin(rng.engine()) == 1,
                 .n_group = 8,
                 .topk_group = 3,
                 .norm_topk_prob = coin(rng.engine()) == 1,
                 .routed_scaling_factor = 2.5f};
    GateRanking ranking;
    const auto want = ReferenceGate(logits, p, &ranking);
    if (NearTie(ranking, p)) {  // drawn again (rare)
      ++near_ties;
      continue;
    }
    std::vector<ExpertChoice> out;
    ASSERT_TRUE(SelectExperts(logits, p, out).ok());
    ASSERT_EQ(out.size(), want.size());
    for (size_t k = 0; k < out.size(); ++k) {
      ASSERT_EQ(out[k].expert, want[k].first) << trial;
      ASSERT_NEAR(out[k].weight, want[k].second, 1e-5 * (1 + want[k].second)) << trial;
    }
  }
  EXPECT_LT(near_ties, 25) << "most cases are checked";
  std::vector<ExpertChoice> out;
  EXPECT_EQ(SelectExperts(std::vector<float>(8, 0.0f), GateParams{.top_k = 9}, out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SelectExperts(std::vector<float>(8, 0.0f), GateParams{.top_k = 2, .group_limited = true, .n_group = 3}, out)
                .code(),
            StatusCode::kInvalidArgument);
}

// DeepSeek-V3's noaux_tc router on a hand-worked case: 4 groups of 2,
// sigmoid scores s = sigmoid(logits) =
//   0.8808 0.8176 | 0.7311 0.6225 | 0.2689 0.2689 | 0.1192 0.1192.
TEST(NoauxGate, BiasesChooseGroupsAndExpertsButNotWeights) {
  const std::vector<float> logits = {2.0f, 1.5f, 1.0f, 0.5f, -1.0f, -1.0f, -2.0f, -2.0f};
  auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  std::vector<float> bias(8, 0.0f);
  GateParams p{.top_k = 2,
               .group_limited = true,
               .n_group = 4,
               .topk_group = 1,
               .norm_topk_prob = true,
               .routed_scaling_factor = 2.5f,
               .noaux_tc = true,
               .correction_bias = bias};
  std::vector<ExpertChoice> out;
  // No bias: group 0 (0.8808 + 0.8176) wins; weights s / (s0 + s1) x 2.5.
  ASSERT_TRUE(SelectExperts(logits, p, out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].expert, 0u);
  EXPECT_EQ(out[1].expert, 1u);
  const double g0 = sigmoid(2.0) + sigmoid(1.5);
  EXPECT_NEAR(out[0].weight, sigmoid(2.0) / g0 * 2.5, 1e-6);
  EXPECT_NEAR(out[1].weight, sigmoid(1.5) / g0 * 2.5, 1e-6);
  EXPECT_NEAR(out[0].weight + out[1].weight, 2.5, 1e-6) << "normalised, then scaled";
  // +0.5 on group 1's experts: its two best sum to 2.3536 > 1.6984, so it
  // wins; the weights stay the unbiased scores.
  bias[2] = bias[3] = 0.5f;
  ASSERT_TRUE(SelectExperts(logits, p, out).ok());
  EXPECT_EQ(out[0].expert, 2u);
  EXPECT_EQ(out[1].expert, 3u);
  const double g1 = sigmoid(1.0) + sigmoid(0.5);
  EXPECT_NEAR(out[0].weight, sigmoid(1.0) / g1 * 2.5, 1e-6);
  EXPECT_NEAR(out[1].weight, sigmoid(0.5) / g1 * 2.5, 1e-6);
  // Normalisation off: the unbiased scores times the factor.
  p.norm_topk_prob = false;
  ASSERT_TRUE(SelectExperts(logits, p, out).ok());
  EXPECT_NEAR(out[0].weight, sigmoid(1.0) * 2.5, 1e-6);
  EXPECT_NEAR(out[1].weight, sigmoid(0.5) * 2.5, 1e-6);
  // No group limit (Kimi-K2's n_group 1): the bias alone reorders experts,
  // 3 (0.6225 + 0.5) above 0 (0.8808) but below 2 (1.2311).
  p.group_limited = false;
  p.n_group = 1;
  p.topk_group = 1;
  p.top_k = 3;
  ASSERT_TRUE(SelectExperts(logits, p, out).ok());
  EXPECT_EQ(out[0].expert, 2u);
  EXPECT_EQ(out[1].expert, 3u);
  EXPECT_EQ(out[2].expert, 0u);
}

// Every biased score negative: the losing groups' experts are excluded
// outright. Filled with 0.0 instead of -inf (as some ports do), they would
// outrank every kept expert and be chosen.
TEST(NoauxGate, LosingGroupsAreExcludedEvenAboveNegativeScores) {
  const std::vector<float> logits = {2.0f, 1.5f, 1.0f, 0.5f, -1.0f, -1.0f, -2.0f, -2.0f};
  const std::vector<float> bias(8, -1.0f);
  GateParams p{.top_k = 4,
               .group_limited = true,
               .n_group = 4,
               .topk_group = 2,
               .norm_topk_prob = true,
               .routed_scaling_factor = 1.0f,
               .noaux_tc = true,
               .correction_bias = bias};
  std::vector<ExpertChoice> out;
  ASSERT_TRUE(SelectExperts(logits, p, out).ok());
  std::vector<uint32_t> chosen;
  for (const ExpertChoice& c : out) chosen.push_back(c.expert);
  EXPECT_EQ(chosen, (std::vector<uint32_t>{0, 1, 2, 3}));
}

TEST(NoauxGate, RandomCasesMatchTheReference) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  int near_ties = 0;
  std::normal_distribution<float> normal(0.0f, 2.0f), bias_normal(0.0f, 0.5f);
  std::uniform_int_distribution<int> coin(0, 1);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<float> logits(64), bias(64);
    for (float& v : logits) v = normal(rng.engine());
    for (float& v : bias) v = bias_normal(rng.engine());
    const bool grouped = coin(rng.engine()) == 1;
    GateParams p{.top_k = 8,
                 .group_limited = grouped,
                 .n_group = grouped ? 8u : 1u,
                 .topk_group = grouped ? 4u : 1u,
                 .norm_topk_prob = coin(rng.engine()) == 1,
                 .routed_scaling_factor = 2.5f,
                 .noaux_tc = true,
                 .correction_bias = bias};
    GateRanking ranking;
    const auto want = ReferenceGate(logits, p, &ranking);
    if (NearTie(ranking, p)) {  // drawn again (rare)
      ++near_ties;
      continue;
    }
    std::vector<ExpertChoice> out;
    ASSERT_TRUE(SelectExperts(logits, p, out).ok());
    ASSERT_EQ(out.size(), want.size());
    for (size_t k = 0; k < out.size(); ++k) {
      ASSERT_EQ(out[k].expert, want[k].first) << trial;
      ASSERT_NEAR(out[k].weight, want[k].second, 1e-5 * (1 + want[k].second)) << trial;
    }
  }
  EXPECT_LT(near_ties, 25) << "most cases are checked";
  std::vector<ExpertChoice> out;
  const std::vector<float> short_bias(7, 0.0f), bias(8, 0.0f);
  EXPECT_EQ(SelectExperts(std::vector<float>(8, 0.0f),
                          GateParams{.top_k = 2, .noaux_tc = true, .correction_bias = short_bias}, out)
                .code(),
            StatusCode::kInvalidArgument)
      << "a bias for each expert";
  EXPECT_EQ(SelectExperts(std::vector<float>(8, 0.0f),
                          GateParams{.top_k = 2,
                                     .group_limited = true,
                                     .n_group = 8,
                                     .topk_group = 2,
                                     .noaux_tc = true,
                                     .correction_bias = bias},
                          out)
                .code(),
            StatusCode::kInvalidArgument)
      << "groups of one expert have no two best";
}

// Block-scaled FP8 weights read as FP8: the bits of Gemm over the weights
// dequantized here (each code's value from its fields, times its block's
// scale, rounded once to float), for DeepSeek's 128 x 128 blocks and odd
// ones, with partial blocks at the edges, on one thread and several.
TEST(GemmFp8, SameBitsAsGemmOverTheDequantizedWeights) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(1e-4f, 1e-2f);
  for (auto [rows, cols, n, block_rows, block_cols] :
       {std::tuple<size_t, size_t, size_t, size_t, size_t>{1, 1, 1, 128, 128},
        {200, 136, 1, 128, 128},
        {301, 160, 3, 128, 128},
        {203, 2070, 8, 128, 128},
        {45, 96, 6, 3, 16},
        {130, 300, 5, 128, 128},
        {37, 70, 9, 3, 5},
        {600, 333, 37, 128, 128}}) {
    const size_t scale_cols = (cols + block_cols - 1) / block_cols;
    std::vector<uint8_t> codes(rows * cols);
    std::vector<float> scales((rows + block_rows - 1) / block_rows * scale_cols), widened(rows * cols), x(n * cols);
    for (uint8_t& c : codes) {
      do c = static_cast<uint8_t>(byte(rng.engine()));
      while ((c & 0x7f) == 0x7f);  // no NaN codes
    }
    for (float& s : scales) s = scale(rng.engine());
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c)
        widened[r * cols + c] = static_cast<float>(ReferenceE4m3Value(codes[r * cols + c]) *
                                                   scales[r / block_rows * scale_cols + c / block_cols]);
    for (float& v : x) v = normal(rng.engine());
    const Fp8BlockScaled w{codes.data(), scales.data(), block_rows, block_cols};
    std::vector<float> rows_out(rows * cols);
    DequantizeFp8Rows(w, cols, 0, rows, rows_out.data());
    ASSERT_EQ(rows_out, widened) << rows << "x" << cols;
    for (size_t threads : {1, 3}) {
      SetKernelThreads(threads);
      std::vector<float> want(n * rows), got(n * rows);
      Gemm(widened.data(), rows, cols, x.data(), n, cols, want.data(), rows);
      GemmFp8(w, rows, cols, x.data(), n, cols, got.data(), rows);
      SetKernelThreads(1);
      ASSERT_EQ(got, want) << rows << "x" << cols << " n " << n << ", " << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace kvtier::kernels
