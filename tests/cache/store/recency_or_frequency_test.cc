#include "services/cache/store/recency_or_frequency.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kvtier::cache {
namespace {

using Choice = RecencyOrFrequency::Choice;

// A score is log2 of the sum of 2^stamp over a block's uses: two uses at
// the same stamp are one more than that stamp, and a use a half-life older
// counts half.
TEST(RecencyOrFrequency, ScoresCountUsesHalvedEachHalfLife) {
  EXPECT_DOUBLE_EQ(RecencyOrFrequency::AddUse(3.0, 3.0), 4.0);
  EXPECT_DOUBLE_EQ(RecencyOrFrequency::AddUse(2.0, 3.0), 3.0 + std::log2(1.5));
  EXPECT_DOUBLE_EQ(RecencyOrFrequency::AddUse(3.0, 2.0), RecencyOrFrequency::AddUse(2.0, 3.0));
  // Far apart: the older use adds next to nothing, and nothing overflows.
  EXPECT_DOUBLE_EQ(RecencyOrFrequency::AddUse(0.0, 5000.0), 5000.0);

  RecencyOrFrequency r(/*half_life_bytes=*/1000);
  EXPECT_EQ(r.Now(), 0.0);
  r.Advance(500);
  EXPECT_DOUBLE_EQ(r.Now(), 0.5);
  r.Advance(1500);
  EXPECT_DOUBLE_EQ(r.Now(), 2.0);
}

// A block stored for the first time scores its one use; one stored again
// after eviction adds it to the uses remembered with it.
TEST(RecencyOrFrequency, AStoredBlockKeepsTheUsesItWasEvictedWith) {
  RecencyOrFrequency r(1000);
  EXPECT_EQ(r.Stored(/*fingerprint=*/7, /*stamp=*/1.0, /*held_blocks=*/10).first, 1.0);
  r.Evicted(7, /*score=*/3.0, Choice::kAgreed, 10);
  EXPECT_DOUBLE_EQ(r.Stored(7, 3.0, 10).first, 4.0);
  EXPECT_EQ(r.Stored(7, 3.0, 10).first, 3.0) << "remembered once";
  // Four times the blocks held are remembered, the oldest forgotten first.
  for (uint64_t k = 100; k < 110; ++k) r.Evicted(k, 9.0, Choice::kAgreed, /*held_blocks=*/2);
  EXPECT_EQ(r.Stored(101, 1.0, 2).first, 1.0);
  EXPECT_GT(r.Stored(102, 1.0, 2).first, 9.0);
  EXPECT_GT(r.MemoryBytes(), 0u);
  // Equal scores: of blocks stored alike the later goes first (the lower
  // key), of blocks used alike the earlier.
  const UseKey stored_first = r.Stored(200, 5.0, 2);
  EXPECT_GT(stored_first, r.Stored(201, 5.0, 2));
  const UseKey used_first = r.Used({5.0, 0});
  EXPECT_LT(used_first, r.Used({5.0, 0}));
}

// Frequency may choose only where room is scarce (probation at most half
// a tier) and recency's victim was used at least twice as much; then in
// its share of such choices, which starts at none and moves as ARC's
// target by the victims that come back.
TEST(RecencyOrFrequency, FrequencyChoosesInItsShareWhereRoomIsScarceAndTheGapLarge) {
  RecencyOrFrequency r(1000);
  EXPECT_EQ(r.frequency_share(), 0.0);
  EXPECT_EQ(r.Choose(5.0, 1.0, /*probation_share=*/0.6), Choice::kAgreed) << "room is not scarce";
  EXPECT_EQ(r.Choose(5.0, 4.5, 0.1), Choice::kAgreed) << "used less than twice as much";
  EXPECT_EQ(r.Choose(5.0, 4.0, 0.5), Choice::kRecency) << "a difference, but frequency's share is none";

  // Recency's victims coming back, in a store of 4 blocks: a step of a
  // quarter each.
  for (uint64_t k = 1; k <= 2; ++k) {
    r.Evicted(k, 5.0, Choice::kRecency, /*held_blocks=*/4);
    r.Stored(k, 6.0, 4);
  }
  EXPECT_DOUBLE_EQ(r.frequency_share(), 0.5);
  // At a half, every other choice is frequency's.
  int by_frequency = 0;
  for (int i = 0; i < 10; ++i) by_frequency += r.Choose(5.0, 1.0, 0.1) == Choice::kFrequency;
  EXPECT_EQ(by_frequency, 5);
  // One of frequency's victims coming back: back a quarter.
  r.Evicted(3, 1.0, Choice::kFrequency, 4);
  r.Stored(3, 6.0, 4);
  EXPECT_DOUBLE_EQ(r.frequency_share(), 0.25);
  // A block both chose alike teaches nothing.
  r.Evicted(4, 1.0, Choice::kAgreed, 4);
  r.Stored(4, 6.0, 4);
  EXPECT_DOUBLE_EQ(r.frequency_share(), 0.25);
}

}  // namespace
}  // namespace kvtier::cache
