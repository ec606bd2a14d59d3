// The kernels' thread pool: every index exactly once, nested and concurrent
// calls, and Gemm's and prefill attention's results bit-identical whatever
// the thread count.
#include "kvtier/kernels/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "kvtier/kernels/expanded_attention.h"
#include "kvtier/kernels/layers.h"
#include "tests/test_random.h"

namespace kvtier::kernels {
namespace {

TEST(ParallelFor, CoversEveryIndexOnceFromConcurrentAndNestedCalls) {
  SetKernelThreads(3);
  std::vector<std::thread> callers;
  std::vector<std::vector<std::atomic<int>>> hits(4);
  for (auto& h : hits) h = std::vector<std::atomic<int>>(1000);
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      ParallelFor(1000, 10, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) ++hits[c][i];
        ParallelFor(5, 1, [&](size_t b, size_t e) { EXPECT_EQ(e - b, 5u) << "a nested call runs inline"; });
      });
    });
  }
  for (auto& t : callers) t.join();
  for (const auto& h : hits) {
    for (const auto& v : h) ASSERT_EQ(v.load(), 1);
  }
  SetKernelThreads(1);
}

TEST(Gemm, SameBitsWithOneOrManyThreads) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t rows = 2000, cols = 517, n = 37;  // enough work to split 4 ways
  std::vector<float> w(rows * cols), x(n * cols), one(n * rows), many(n * rows);
  for (float& v : w) v = normal(rng.engine());
  for (float& v : x) v = normal(rng.engine());
  SetKernelThreads(1);
  Gemm(w.data(), rows, cols, x.data(), n, cols, one.data(), rows);
  SetKernelThreads(4);
  Gemm(w.data(), rows, cols, x.data(), n, cols, many.data(), rows);
  SetKernelThreads(1);
  EXPECT_EQ(one, many);
}

// Prefill attention splits (head, block of rows) jobs over the threads.
TEST(ExpandedAttention, SameBitsWithOneOrManyThreads) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 0.5f);
  const auto random = [&](size_t count) {
    std::vector<float> v(count);
    for (float& x : v) x = normal(rng.engine());
    return v;
  };
  const MlaDims d{4, 16, 8, 16, 64};
  const size_t tokens = 150, rows = 100;
  const std::vector<float> w_uk = random(d.heads * d.nope * d.kv), w_uv = random(d.heads * d.v * d.kv),
                           context = random(tokens * (d.kv + d.rope)), q = random(rows * d.heads * (d.nope + d.rope)),
                           q_pe = random(rows * d.heads * d.rope);
  std::vector<int64_t> positions(rows);
  for (size_t r = 0; r < rows; ++r) positions[r] = static_cast<int64_t>(tokens - rows + r);
  std::vector<float> one(rows * d.heads * d.v), many(one.size());
  SetKernelThreads(1);
  ExpandedAttention(d, w_uk.data(), w_uv.data(), context, rows, positions.data(), q.data(), q_pe.data(), 0.2f,
                    one.data());
  SetKernelThreads(4);
  ExpandedAttention(d, w_uk.data(), w_uv.data(), context, rows, positions.data(), q.data(), q_pe.data(), 0.2f,
                    many.data());
  SetKernelThreads(1);
  EXPECT_EQ(one, many);
}

}  // namespace
}  // namespace kvtier::kernels
