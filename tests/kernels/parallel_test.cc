// The kernels' thread pool: every index exactly once, nested and concurrent
// calls, and Gemm's results bit-identical whatever the thread count.
#include "kvtier/kernels/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace kvtier::kernels
