// RecordPool: strings handed out again once let go, never while held, and
// no more than its limit kept idle.
#include "services/cache/client/record_pool.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

TEST(RecordPool, GivesALetGoStringAgainForItsSizeOnly) {
  std::shared_ptr<RecordPool> pool = RecordPool::Create(1 << 20);
  std::shared_ptr<std::string> a = pool->Take(1000);
  ASSERT_EQ(a->size(), 1000u);
  const char* a_bytes = a->data();
  std::shared_ptr<std::string> b = pool->Take(1000);
  EXPECT_NE(b->data(), a_bytes);  // a is still held
  EXPECT_EQ(pool->held_bytes(), 2000u);
  a.reset();
  EXPECT_EQ(pool->idle_bytes(), 1000u);
  EXPECT_EQ(pool->held_bytes(), 1000u);
  const std::shared_ptr<std::string> other_size = pool->Take(999);
  EXPECT_EQ(other_size->size(), 999u);
  EXPECT_EQ(pool->idle_bytes(), 1000u);
  const std::shared_ptr<std::string> again = pool->Take(1000);
  EXPECT_EQ(again->data(), a_bytes);
  EXPECT_EQ(pool->idle_bytes(), 0u);
  EXPECT_EQ(pool->held_bytes(), 2999u);
}

TEST(RecordPool, KeepsNoMoreThanItsLimitIdle) {
  std::shared_ptr<RecordPool> pool = RecordPool::Create(2500);
  std::vector<std::shared_ptr<std::string>> held;
  for (int i = 0; i < 5; ++i) held.push_back(pool->Take(1000));
  held.clear();
  EXPECT_EQ(pool->idle_bytes(), 2000u);
  EXPECT_EQ(pool->held_bytes(), 0u);  // freed beyond the limit, but let go all the same
}

TEST(RecordPool, AStringItsHolderResizedIsFreedNotPooled) {
  std::shared_ptr<RecordPool> pool = RecordPool::Create(1 << 20);
  std::shared_ptr<std::string> record = pool->Take(1000);
  record->resize(10);
  record.reset();
  EXPECT_EQ(pool->held_bytes(), 0u);
  EXPECT_EQ(pool->idle_bytes(), 0u);
  EXPECT_EQ(pool->Take(10)->size(), 10u);
}

TEST(RecordPool, StringsOutliveTheirPoolsLastOtherHolder) {
  std::shared_ptr<RecordPool> pool = RecordPool::Create(1 << 20);
  const std::weak_ptr<RecordPool> watch = pool;
  std::shared_ptr<std::string> record = pool->Take(64);
  pool.reset();
  EXPECT_FALSE(watch.expired());
  record->assign(64, 'x');
  record.reset();
  EXPECT_TRUE(watch.expired());
}

// Threads take, fill with their own bytes, check and let go: no string is
// ever held by two at once.
TEST(RecordPool, NoTwoHoldersShareAStringAcrossThreads) {
  std::shared_ptr<RecordPool> pool = RecordPool::Create(64 << 10);
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const uint64_t seed = rng.engine()();
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 mine(seed + t);
      for (int i = 0; i < 2000; ++i) {
        const size_t size = 1000 * (1 + mine() % 4);
        std::vector<std::shared_ptr<std::string>> held;
        for (int k = 0; k < 3; ++k) {
          held.push_back(pool->Take(size));
          held.back()->assign(size, static_cast<char>('a' + t * 3 + k));
        }
        std::this_thread::yield();
        for (int k = 0; k < 3; ++k) {
          bad[t] += held[k]->size() != size ||
                    held[k]->find_first_not_of(static_cast<char>('a' + t * 3 + k)) != std::string::npos;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
  EXPECT_LE(pool->idle_bytes(), size_t{64} << 10);
  EXPECT_EQ(pool->held_bytes(), 0u);
}

}  // namespace
}  // namespace kvtier::cache
