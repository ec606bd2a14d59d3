// Rendezvous hashing over cache shards: an even spread, and adding a shard
// moves only the keys the new shard wins.
#include "services/cache/client/shard_set.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "tests/test_random.h"

namespace kvtier::cache {
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
  std::map<std::string, size_t> counts;
  size_t moved = 0;
  for (const auto& k : keys) {
    const std::string before = (*three)->ShardOf(k), after = (*four)->ShardOf(k);
    ++counts[before];
    if (before != after) {
      ++moved;
      ASSERT_EQ(after, "10.0.0.4:7070") << "a key moved between old shards";
    }
  }
  ASSERT_EQ(counts.size(), 3u);
  for (const auto& [shard, c] : counts) EXPECT_NEAR(c / 30000.0, 1 / 3.0, 0.02) << shard;
  EXPECT_NEAR(moved / 30000.0, 0.25, 0.02);
  // A shard's choice depends on its address, not its position in the list.
  auto reordered = ShardSet::Create("10.0.0.3:7070,10.0.0.1:7070,10.0.0.2:7070", absl::Seconds(1));
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ((*reordered)->ShardOf(keys[i]), (*three)->ShardOf(keys[i]));
  }
}

// Discovery changes a set in place: a shard added takes only the keys it
// wins, one removed gives up only its own, and none leaves no owner.
TEST(ShardSet, NewTargetsMoveOnlyTheKeysOfTheShardsThatChanged) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const std::vector<kvblock::BlockHash> keys = RandomKeys(5000, rng.engine());
  ShardSet shards(absl::Seconds(1));
  EXPECT_EQ(shards.size(), 0u);
  EXPECT_EQ(shards.ShardOf(keys[0]), "");
  ASSERT_TRUE(shards.SetTargets({"a.test:7070", "b.test:7070", "c.test:7070"}).ok());
  std::vector<std::string> before;
  for (const auto& k : keys) before.push_back(shards.ShardOf(k));
  ASSERT_TRUE(shards.SetTargets({"a.test:7070", "c.test:7070", "d.test:7070"}).ok());
  EXPECT_EQ(shards.size(), 3u);
  size_t moved = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string after = shards.ShardOf(keys[i]);
    if (after == before[i]) continue;
    ++moved;
    ASSERT_TRUE(before[i] == "b.test:7070" || after == "d.test:7070") << before[i] << " -> " << after;
  }
  // All of b's third moves; a key of a's (a beat b and c) moves when d
  // beats a as well: P(d > a > b, c) / P(a > b, c) = (2/24) / (1/3), a
  // quarter of a's and of c's thirds.
  EXPECT_NEAR(moved / 5000.0, 1 / 3.0 + 2 * (1 / 3.0) * (1 / 4.0), 0.03);
  EXPECT_EQ(shards.SetTargets({"a.test:7070", "a.test:7070"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shards.size(), 3u) << "a refused list changes nothing";
  ASSERT_TRUE(shards.SetTargets({}).ok());
  EXPECT_EQ(shards.ShardOf(keys[0]), "");
}

TEST(ShardSet, RejectsBadShardLists) {
  for (const char* bad : {"", " , ", "10.0.0.1:7070,10.0.0.1:7070", "no-port"}) {
    EXPECT_EQ(ShardSet::Create(bad, absl::Seconds(1)).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace kvtier::cache
