// Rendezvous hashing over cache shards: an even spread, and adding a shard
// moves only the keys the new shard wins.
#include "services/serving/shard_set.h"

#include <gtest/gtest.h>

#include <random>

#include "tests/test_random.h"

namespace kvtier::serving {
namespace {

std::vector<kvblock::BlockHash> RandomKeys(size_t n, std::mt19937_64& rng) {
  std::vector<kvblock::BlockHash> keys(n);
  for (auto& k : keys) {
    for (auto& b : k) b = static_cast<uint8_t>(rng());
  }
  return keys;
}

TEST(ShardSet, SpreadsKeysEvenlyAndMovesOnlyWhatANewShardWins) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const std::vector<kvblock::BlockHash> keys = RandomKeys(30000, rng.engine());
  auto three = ShardSet::Create("10.0.0.1:7070,10.0.0.2:7070,10.0.0.3:7070", absl::Seconds(1));
  auto four = ShardSet::Create("10.0.0.1:7070,10.0.0.2:7070,10.0.0.3:7070,10.0.0.4:7070", absl::Seconds(1));
  ASSERT_TRUE(three.ok() && four.ok());
  std::vector<size_t> counts(3);
  size_t moved = 0;
  for (const auto& k : keys) {
    const size_t before = (*three)->ShardOf(k), after = (*four)->ShardOf(k);
    ++counts[before];
    if (before != after) {
      ++moved;
      ASSERT_EQ(after, 3u) << "a key moved between old shards";
    }
  }
  for (size_t c : counts) EXPECT_NEAR(c / 30000.0, 1 / 3.0, 0.02);
  EXPECT_NEAR(moved / 30000.0, 0.25, 0.02);
  // A shard's choice depends on its address, not its position in the list.
  auto reordered = ShardSet::Create("10.0.0.3:7070,10.0.0.1:7070,10.0.0.2:7070", absl::Seconds(1));
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ((*reordered)->target((*reordered)->ShardOf(keys[i])), (*three)->target((*three)->ShardOf(keys[i])));
  }
}

TEST(ShardSet, RejectsBadShardLists) {
  for (const char* bad : {"", " , ", "10.0.0.1:7070,10.0.0.1:7070", "no-port"}) {
    EXPECT_EQ(ShardSet::Create(bad, absl::Seconds(1)).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace kvtier::serving
