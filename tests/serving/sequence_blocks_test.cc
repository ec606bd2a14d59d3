// Block records to and from a sequence's cache: a round trip gives the
// same payloads, the appended blocks are views that keep their record
// alive, and a record that is corrupt, partial or of another layout is
// refused with the cache left as it was.
#include "services/serving/sequence_blocks.h"

#include <gtest/gtest.h>

#include <random>

#include "services/kvblock/block_format.h"
#include "tests/test_random.h"

namespace kvtier::serving {
namespace {

kvblock::LatentLayout Layout() {
  return {.model_id = "sequence-blocks-test",
          .num_layers = 3,
          .kv_lora_rank = 32,
          .rope_dim = 8,
          .tokens_per_block = 16,
          .codec = kernels::Codec::kInt8};
}

// `blocks` sealed blocks of fresh random latents in every layer.
runtime::SequenceCache RandomCache(const kvblock::LatentLayout& layout, size_t blocks, std::mt19937_64& rng) {
  runtime::SequenceCache cache = EmptyCache(layout);
  std::normal_distribution<float> value(0.0f, 1.5f);
  const size_t row = size_t{layout.kv_lora_rank} + layout.rope_dim;
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    cache.tail[l].resize(blocks * layout.tokens_per_block * row);
    for (float& v : cache.tail[l]) v = value(rng);
    EXPECT_TRUE(runtime::SealFullBlocks(cache, l, layout.kv_lora_rank, layout.rope_dim).ok());
  }
  cache.length = static_cast<int64_t>(blocks * layout.tokens_per_block);
  return cache;
}

TEST(SequenceBlocks, RecordsRoundTripAndTheBlocksViewTheirRecord) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const kvblock::LatentLayout layout = Layout();
  const runtime::SequenceCache source = RandomCache(layout, 3, rng.engine());
  runtime::SequenceCache copy = EmptyCache(layout);
  std::weak_ptr<const std::string> first_record;
  for (size_t b = 0; b < 3; ++b) {
    absl::StatusOr<std::string> record = BlockRecord(layout, source, b, 0, layout.num_layers);
    ASSERT_TRUE(record.ok()) << record.status();
    auto shared = std::make_shared<const std::string>(*std::move(record));
    if (b == 0) first_record = shared;
    ASSERT_TRUE(AppendBlockRecord(shared, layout, copy).ok());
    // Each layer's payload lies inside the record, not in a copy.
    const auto* begin = reinterpret_cast<const uint8_t*>(shared->data());
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      EXPECT_GE(copy.blocks[l][b].data(), begin);
      EXPECT_LE(copy.blocks[l][b].data() + copy.blocks[l][b].size(), begin + shared->size());
    }
  }
  EXPECT_EQ(copy.length, source.length);
  for (uint32_t l = 0; l < layout.num_layers; ++l) EXPECT_EQ(copy.blocks[l], source.blocks[l]) << "layer " << l;
  EXPECT_FALSE(first_record.expired());  // held by the blocks alone
  copy = EmptyCache(layout);
  EXPECT_TRUE(first_record.expired());
}

TEST(SequenceBlocks, BadRecordsAreRefusedAndChangeNothing) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const kvblock::LatentLayout layout = Layout();
  const runtime::SequenceCache source = RandomCache(layout, 1, rng.engine());
  const std::string record = *BlockRecord(layout, source, 0, 0, layout.num_layers);
  runtime::SequenceCache cache = EmptyCache(layout);
  const auto code = [&](std::string bytes, const kvblock::LatentLayout& as) {
    return AppendBlockRecord(std::make_shared<const std::string>(std::move(bytes)), as, cache).code();
  };
  std::string flipped = record;
  flipped[std::uniform_int_distribution<size_t>(kvblock::kBlockHeaderBytes, record.size() - 1)(rng.engine())] ^= 0x10;
  EXPECT_EQ(code(flipped, layout), absl::StatusCode::kDataLoss);
  EXPECT_NE(code(record.substr(0, record.size() - 1), layout), absl::StatusCode::kOk);
  EXPECT_EQ(code(*BlockRecord(layout, source, 0, 1, 2), layout), absl::StatusCode::kInvalidArgument);
  kvblock::LatentLayout other = layout;
  other.codec = kernels::Codec::kInt4;
  runtime::SequenceCache int4_cache = EmptyCache(other);
  EXPECT_NE(AppendBlockRecord(std::make_shared<const std::string>(record), other, int4_cache).code(),
            absl::StatusCode::kOk);
  EXPECT_EQ(AppendBlockRecord(nullptr, layout, cache).code(), absl::StatusCode::kInvalidArgument);
  for (const auto& layer : cache.blocks) EXPECT_TRUE(layer.empty());
  EXPECT_EQ(cache.length, 0);
  // A cache with a tail takes no whole block.
  cache.tail[0].assign(size_t{layout.kv_lora_rank} + layout.rope_dim, 0.5f);
  EXPECT_EQ(code(record, layout), absl::StatusCode::kFailedPrecondition);
  cache.tail[0].clear();
  EXPECT_EQ(code(record, layout), absl::StatusCode::kOk);
}

// A record whose CRC was checked where it landed (kCheckedBefore) is not
// read for it again (the flipped byte goes unseen), but its header still is.
TEST(SequenceBlocks, ARecordCheckedOnTheWayInIsNotCheckedAgain) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const kvblock::LatentLayout layout = Layout();
  const runtime::SequenceCache source = RandomCache(layout, 1, rng.engine());
  std::string record = *BlockRecord(layout, source, 0, 0, layout.num_layers);
  record[kvblock::kBlockHeaderBytes + 5] ^= 0x01;
  auto bytes = std::make_shared<const std::string>(record);
  runtime::SequenceCache cache = EmptyCache(layout);
  EXPECT_EQ(AppendBlockRecord(bytes, layout, cache, kvblock::CrcCheck::kCheck).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(AppendBlockRecord(bytes, layout, cache, kvblock::CrcCheck::kCheckedBefore).ok());
  EXPECT_EQ(cache.blocks[0].size(), 1u);
  const auto partial = std::make_shared<const std::string>(*BlockRecord(layout, source, 0, 0, 2));
  EXPECT_EQ(AppendBlockRecord(partial, layout, cache, kvblock::CrcCheck::kCheckedBefore).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::serving
