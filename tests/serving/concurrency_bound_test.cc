// ConcurrencyBound: places per key, given back when a hold is let go, even
// from many threads at once.
#include "services/serving/concurrency_bound.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace kvtier::serving {
namespace {

TEST(ConcurrencyBoundTest, EachKeyHoldsAtMostItsPlaces) {
  ConcurrencyBound bound(2, "generations of tenant", "--max-generations-per-tenant");
  auto a1 = bound.Hold("acme"), a2 = bound.Hold("acme");
  ASSERT_TRUE(a1.ok() && a2.ok());
  const auto a3 = bound.Hold("acme");
  EXPECT_EQ(a3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(a3.status().message().find("generations of tenant acme: 2 under way"), std::string::npos) << a3.status();
  EXPECT_NE(a3.status().message().find("--max-generations-per-tenant"), std::string::npos);
  EXPECT_TRUE(bound.Hold("globex").ok());  // another key: its own places (let go at once)
  a1->reset();
  EXPECT_EQ(bound.Held("acme"), 1u);
  EXPECT_TRUE(bound.Hold("acme").ok());
  a2->reset();
  EXPECT_EQ(bound.Held("acme"), 0u);
}

TEST(ConcurrencyBoundTest, ThreadsNeverTakeMoreThanThePlaces) {
  ConcurrencyBound bound(3, "x", "--x");
  std::atomic<int> most{0}, now{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        auto held = bound.Hold("k");
        if (!held.ok()) continue;
        const int n = ++now;
        int seen = most.load();
        while (n > seen && !most.compare_exchange_weak(seen, n)) {
        }
        --now;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(most.load(), 3);
  EXPECT_EQ(bound.Held("k"), 0u);
}

}  // namespace
}  // namespace kvtier::serving
