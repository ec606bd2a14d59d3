#include "services/cache/store/arc_target.h"

#include <gtest/gtest.h>

namespace kvtier::cache {
namespace {

// The probation share, ARC's target: worked by hand on a store of 10 blocks
// (a block evicted on probation raises it, one evicted after use lowers it).
TEST(ArcTarget, MovesByArcsStepsBetweenItsFloorAndOne) {
  ArcTarget p(/*start=*/1.0, /*floor=*/0.1);
  EXPECT_EQ(p.share(), 1.0) << "starts as plain recency";
  EXPECT_FALSE(p.Returning(7, 10)) << "never evicted: on probation";

  // A used block evicted and stored again: the share falls one block (of 10).
  p.Evicted(1, /*raises=*/false, 10);
  EXPECT_TRUE(p.Returning(1, 10));
  EXPECT_DOUBLE_EQ(p.share(), 0.9);
  EXPECT_FALSE(p.Returning(1, 10)) << "remembered once";

  // Three blocks evicted on probation, one used: a used one coming back
  // steps by 3 (those on probation over the used, remembered before it
  // comes back).
  for (uint64_t k : {20, 21, 22}) p.Evicted(k, /*raises=*/true, 10);
  p.Evicted(2, /*raises=*/false, 10);
  EXPECT_TRUE(p.Returning(2, 10));
  EXPECT_DOUBLE_EQ(p.share(), 0.6);
  // One on probation coming back: by 1 (no used one remembered now).
  EXPECT_TRUE(p.Returning(20, 10));
  EXPECT_DOUBLE_EQ(p.share(), 0.7);

  // Never under the floor, never over the whole tier.
  for (uint64_t k = 100; k < 120; ++k) {
    p.Evicted(k, /*raises=*/false, 100);
    EXPECT_TRUE(p.Returning(k, 2));
  }
  EXPECT_DOUBLE_EQ(p.share(), 0.1);
  for (uint64_t k = 200; k < 220; ++k) {
    p.Evicted(k, /*raises=*/true, 100);
    EXPECT_TRUE(p.Returning(k, 2));
  }
  EXPECT_DOUBLE_EQ(p.share(), 1.0);
}

// It remembers as many blocks of each kind as the store holds: the
// oldest are forgotten first.
TEST(ArcTarget, RemembersAsManyOfEachKindAsTheStoreHolds) {
  ArcTarget p(/*start=*/1.0, /*floor=*/0.1);
  for (uint64_t k = 0; k < 5; ++k) p.Evicted(k, /*raises=*/true, 3);
  EXPECT_FALSE(p.Returning(0, 3));
  EXPECT_FALSE(p.Returning(1, 3));
  EXPECT_TRUE(p.Returning(2, 3));
  EXPECT_TRUE(p.Returning(4, 3));
  EXPECT_GT(p.MemoryBytes(), 0u);
}

}  // namespace
}  // namespace kvtier::cache
