#include "services/runtime/sealed_block.h"

#include <gtest/gtest.h>

#include <memory>
#include <unordered_set>
#include <vector>

namespace kvtier::runtime {
namespace {

// Ids name payloads: every new block gets one no other block has; a copy is
// the same block (same id, same bytes, not copied); equality is by bytes.
TEST(SealedBlock, IdsNameOnePayloadAndCopiesShareIt) {
  std::unordered_set<uint64_t> ids;
  std::vector<SealedBlock> blocks;
  for (int i = 0; i < 100; ++i) {
    blocks.emplace_back(std::vector<uint8_t>{static_cast<uint8_t>(i), 7});
    EXPECT_TRUE(ids.insert(blocks.back().id()).second);
  }
  const SealedBlock copy = blocks[5];
  EXPECT_EQ(copy.id(), blocks[5].id());
  EXPECT_EQ(copy.data(), blocks[5].data());
  const SealedBlock same_bytes(std::vector<uint8_t>{5, 7});
  EXPECT_NE(same_bytes.id(), blocks[5].id());
  EXPECT_EQ(same_bytes, blocks[5]);
  EXPECT_FALSE(same_bytes == blocks[6]);
  const std::span<const uint8_t> view = copy;
  EXPECT_EQ(view.size(), 2u);
  EXPECT_EQ(view[0], 5);
}

// A block viewing into shared memory keeps that memory alive (and no
// longer), and is a new payload (its own id) even over the same bytes.
TEST(SealedBlock, AViewKeepsItsOwnerAlive) {
  auto record = std::make_shared<std::vector<uint8_t>>(std::vector<uint8_t>{1, 2, 3, 4, 5, 6});
  const std::weak_ptr<std::vector<uint8_t>> watch = record;
  {
    const SealedBlock first(record, std::span<const uint8_t>(*record).subspan(0, 3));
    SealedBlock second(record, std::span<const uint8_t>(*record).subspan(3, 3));
    record.reset();
    EXPECT_FALSE(watch.expired());
    EXPECT_EQ(first, SealedBlock(std::vector<uint8_t>{1, 2, 3}));
    EXPECT_EQ(second.bytes()[2], 6);
    EXPECT_NE(first.id(), second.id());
    const SealedBlock copy = second;
    second = first;
    EXPECT_EQ(copy.bytes()[0], 4);
    EXPECT_FALSE(watch.expired());
  }
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace kvtier::runtime
