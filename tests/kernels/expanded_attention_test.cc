// The expanded-form attention against float64 attention written out per
// head, on fresh random inputs, and the cost model's choice of form.
#include "kvtier/kernels/expanded_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "kvtier/kernels/mla_attention.h"
#include "tests/test_random.h"

namespace kvtier::kernels {
namespace {

std::vector<float> Random(size_t n, std::mt19937_64& rng, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// ExpandedAttention for rows at `positions` over a context of `tokens`,
// against float64 attention written out per head.
void CheckAgainstFloat64(const MlaDims& d, size_t tokens, const std::vector<int64_t>& positions, std::mt19937_64& rng) {
  const size_t dim = d.kv + d.rope, rows = positions.size();
  const std::vector<float> w_uk = Random(d.heads * d.nope * d.kv, rng, 0.2f);
  const std::vector<float> w_uv = Random(d.heads * d.v * d.kv, rng, 0.2f);
  const std::vector<float> context = Random(tokens * dim, rng, 1.0f);
  const std::vector<float> q = Random(rows * d.heads * (d.nope + d.rope), rng, 0.5f);
  const std::vector<float> q_pe = Random(rows * d.heads * d.rope, rng, 0.5f);
  const float scale = 0.3f;
  std::vector<float> out(rows * d.heads * d.v, NAN);
  ExpandedAttention(d, w_uk.data(), w_uv.data(), context, rows, positions.data(), q.data(), q_pe.data(), scale,
                    out.data());
  // Keys and values once, in float64: [heads][tokens][nope], [heads][tokens][v].
  std::vector<double> keys(d.heads * tokens * d.nope), values(d.heads * tokens * d.v);
  for (size_t h = 0; h < d.heads; ++h) {
    for (size_t t = 0; t < tokens; ++t) {
      for (size_t i = 0; i < d.nope; ++i) {
        double k = 0;
        for (size_t c = 0; c < d.kv; ++c) k += double{w_uk[(h * d.nope + i) * d.kv + c]} * context[t * dim + c];
        keys[(h * tokens + t) * d.nope + i] = k;
      }
      for (size_t j = 0; j < d.v; ++j) {
        double v = 0;
        for (size_t c = 0; c < d.kv; ++c) v += double{w_uv[(h * d.v + j) * d.kv + c]} * context[t * dim + c];
        values[(h * tokens + t) * d.v + j] = v;
      }
    }
  }
  for (size_t r = 0; r < rows; ++r) {
    for (size_t h = 0; h < d.heads; ++h) {
      const size_t seen = static_cast<size_t>(positions[r]) + 1;
      std::vector<double> s(seen);
      double max = -INFINITY;
      for (size_t t = 0; t < seen; ++t) {
        double v = 0;
        const float* q_nope = q.data() + (r * d.heads + h) * (d.nope + d.rope);
        const float* q_rope = q_pe.data() + (r * d.heads + h) * d.rope;
        for (size_t i = 0; i < d.nope; ++i) v += double{q_nope[i]} * keys[(h * tokens + t) * d.nope + i];
        for (size_t i = 0; i < d.rope; ++i) v += double{q_rope[i]} * context[t * dim + d.kv + i];
        max = std::max(max, s[t] = v * scale);
      }
      double sum = 0;
      for (double& v : s) sum += (v = std::exp(v - max));
      for (size_t j = 0; j < d.v; ++j) {
        double want = 0;
        for (size_t t = 0; t < seen; ++t) want += s[t] / sum * values[(h * tokens + t) * d.v + j];
        ASSERT_NEAR(out[(r * d.heads + h) * d.v + j], want, 1e-5 * (1 + std::fabs(want)))
            << "row " << r << " (position " << positions[r] << ") head " << h << " dim " << j;
      }
    }
  }
}

TEST(ExpandedAttention, MatchesFloat64PerHeadAttention) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  CheckAgainstFloat64({4, 16, 8, 12, 32}, 41, {0, 7, 22, 39, 40}, rng.engine());  // causal rows of a pass
}

// More rows than one block of the kernel's work (32), at positions in any
// order: each row sees exactly its own prefix.
TEST(ExpandedAttention, ManyRowsAtAnyPositionsMatchFloat64) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const size_t tokens = 97;
  std::vector<int64_t> positions(75);
  std::uniform_int_distribution<int64_t> position(0, tokens - 1);
  for (int64_t& p : positions) p = position(rng.engine());
  positions[40] = tokens - 1;
  positions[41] = 0;
  CheckAgainstFloat64({3, 8, 4, 6, 24}, tokens, positions, rng.engine());
}

// W_UK folded into the queries of some rows, against float64; the rows not
// listed keep their (poisoned) values. Listed rows in fours and one at a
// time, latent dims in 32s and a tail; the AVX-512 tiles and the portable
// path.
TEST(AbsorbQueries, MatchesFloat64AndLeavesOtherRowsAlone) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  using Case = std::tuple<MlaDims, size_t, std::vector<size_t>>;
  const Case cases[] = {{{5, 24, 8, 12, 40}, 7, {0, 2, 3, 6}}, {{3, 16, 8, 12, 80}, 12, {1, 2, 3, 5, 6, 8, 9, 10, 11}}};
  for (const auto& [d, rows, listed] : cases) {
    for (bool tiles : {true, false}) {
      SCOPED_TRACE(tiles ? "tiles" : "portable");
      const size_t qdim = d.nope + d.rope;
      const std::vector<float> w_uk = Random(d.heads * d.nope * d.kv, rng.engine(), 0.2f);
      const std::vector<float> q = Random(rows * d.heads * qdim, rng.engine(), 1.0f);
      std::vector<float> q_latent(rows * d.heads * d.kv, NAN);
      SetAttentionTilesForTesting(tiles);
      AbsorbQueries(d, w_uk.data(), q.data(), listed, q_latent.data());
      SetAttentionTilesForTesting(true);
      for (size_t r = 0; r < rows; ++r) {
        const bool is_listed = std::find(listed.begin(), listed.end(), r) != listed.end();
        for (size_t h = 0; h < d.heads; ++h) {
          for (size_t c = 0; c < d.kv; ++c) {
            const float got = q_latent[(r * d.heads + h) * d.kv + c];
            if (!is_listed) {
              ASSERT_TRUE(std::isnan(got)) << "row " << r << " was not listed";
              continue;
            }
            double want = 0;
            for (size_t i = 0; i < d.nope; ++i) {
              want += double{q[(r * d.heads + h) * qdim + i]} * w_uk[(h * d.nope + i) * d.kv + c];
            }
            ASSERT_NEAR(got, want, 1e-5 * (1 + std::fabs(want))) << "row " << r << " head " << h << " dim " << c;
          }
        }
      }
    }
  }
}

TEST(MlaFormCosts, ExpandsFreshPrefillsAndAbsorbsDecodeSteps) {
  const MlaDims v2{16, 128, 64, 128, 512};
  auto expanded = [&](size_t before, size_t count) {
    const MlaCosts c = MlaFormCosts(v2, count, before + count, count * before + count * (count + 1) / 2);
    return c.expanded < c.absorbed;
  };
  EXPECT_TRUE(expanded(0, 2048));  // a fresh prompt
  EXPECT_TRUE(expanded(0, 64));
  EXPECT_FALSE(expanded(4096, 1));   // a decode step
  EXPECT_FALSE(expanded(1984, 64));  // a short suffix after a long cached prefix
}

}  // namespace
}  // namespace kvtier::kernels
