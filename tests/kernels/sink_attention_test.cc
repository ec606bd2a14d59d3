// DeepSeek-V4's attention with sinks against the formula in float64
// (sink_attention.h), on fresh random inputs: head dims that take the
// register tiles (multiples of 16, 48 ending inside an AVX-512 tile's 64
// channels) and the portable path (40), counts around the tiles' groups of
// 3 (AVX2) and 4 (AVX-512) entries, and a sink large enough to take most
// of the weight.
#include "kvtier/kernels/sink_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/test_random.h"

namespace kvtier::kernels {
namespace {

std::vector<double> Reference(const SinkAttentionShape& s, const std::vector<float>& q,
                              const std::vector<float>& entries, const std::vector<float>& sinks) {
  const size_t count = entries.size() / s.dim;
  std::vector<double> out(size_t{s.heads} * s.dim, 0.0);
  for (size_t h = 0; h < s.heads; ++h) {
    std::vector<double> score(count);
    double max = -INFINITY;
    for (size_t e = 0; e < count; ++e) {
      double dot = 0;
      for (size_t i = 0; i < s.dim; ++i) dot += double{q[h * s.dim + i]} * entries[e * s.dim + i];
      max = std::max(max, score[e] = s.scale * dot);
    }
    double denominator = std::exp(sinks[h] - max);
    for (double& v : score) denominator += (v = std::exp(v - max));
    for (size_t e = 0; e < count; ++e) {
      for (size_t i = 0; i < s.dim; ++i) out[h * s.dim + i] += score[e] / denominator * entries[e * s.dim + i];
    }
  }
  return out;
}

TEST(SinkAttention, EqualsFloat64) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const uint32_t dim : {64u, 48u, 40u, 512u}) {
    for (const uint32_t heads : {1u, 6u}) {
      for (const size_t count : {size_t{1}, size_t{7}, size_t{130}}) {
        const SinkAttentionShape shape{heads, dim, 1.0f / std::sqrt(static_cast<float>(dim))};
        std::vector<float> q(size_t{heads} * dim), entries(count * dim), sinks(heads);
        for (float& v : q) v = 2.0f * normal(rng.engine());
        for (float& v : entries) v = normal(rng.engine());
        for (float& v : sinks) v = normal(rng.engine());
        sinks[0] = 8.0f;
        std::vector<float> out(q.size(), NAN);
        SinkAttention(shape, q.data(), entries.data(), count, sinks.data(), out.data());
        const std::vector<double> want = Reference(shape, q, entries, sinks);
        for (size_t i = 0; i < out.size(); ++i) {
          ASSERT_NEAR(out[i], want[i], 1e-5 * (1 + std::fabs(want[i])))
              << "dim " << dim << ", heads " << heads << ", count " << count << " at " << i;
        }
      }
    }
  }
}

TEST(SinkAttention, NoEntriesGiveZeros) {
  const SinkAttentionShape shape{2, 64, 0.125f};
  std::vector<float> q(128, 1.0f), sinks(2, 0.0f), out(128, NAN);
  SinkAttention(shape, q.data(), nullptr, 0, sinks.data(), out.data());
  for (float v : out) ASSERT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace kvtier::kernels
