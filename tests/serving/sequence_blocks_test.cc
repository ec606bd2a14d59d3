// Block records to and from a sequence's cache: a round trip gives the
// same payloads, the appended blocks are views that keep their record
// alive, and a record that is corrupt, partial or of another layout is
// refused with the cache left as it was.
#include "services/serving/sequence_blocks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/crc32c.h"
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

// DeepSeek-V3.2's: the same with an indexer key of 32 a token.
kvblock::LatentLayout IndexedLayout() {
  kvblock::LatentLayout l = Layout();
  l.indexer_dim = 32;
  l.indexer_encoding = kvblock::IndexerEncoding::kFp8;
  l.block_format_version = kvblock::kIndexedBlockFormatVersion;
  return l;
}

// `blocks` sealed blocks of fresh random latents in every layer, then
// `tail` tokens in float; indexer keys as the model makes them (any code
// but NaN's, power-of-two scales) for every token when the layout has them.
runtime::SequenceCache RandomCache(const kvblock::LatentLayout& layout, size_t blocks, std::mt19937_64& rng,
                                   size_t tail = 0) {
  runtime::SequenceCache cache = EmptyCache(layout);
  std::normal_distribution<float> value(0.0f, 1.5f);
  const size_t row = size_t{layout.kv_lora_rank} + layout.rope_dim;
  const size_t tokens = blocks * layout.tokens_per_block + tail;
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    cache.tail[l].resize(tokens * row);
    for (float& v : cache.tail[l]) v = value(rng);
    EXPECT_TRUE(runtime::SealFullBlocks(cache, l, layout.kv_lora_rank, layout.rope_dim).ok());
    if (layout.indexer_dim == 0) continue;
    for (size_t i = 0; i < tokens * layout.indexer_dim; ++i) {
      cache.index_keys[l].push_back(static_cast<uint8_t>(rng() % 0x7f) | (rng() % 2 ? 0x80 : 0));
    }
    for (size_t t = 0; t < tokens; ++t)
      cache.index_scales[l].push_back(std::ldexp(1.0f, static_cast<int>(rng() % 16) - 12));
  }
  cache.length = static_cast<int64_t>(tokens);
  return cache;
}

// Rewrites a record's CRC so that only the intended defect remains.
void Reseal(std::string& record) {
  const uint32_t crc = kvblock::Crc32c(record.data(), record.size() - 4);
  std::memcpy(record.data() + record.size() - 4, &crc, 4);
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

// A tail's latents come from the request: one that is not finite (the
// model never makes one) is refused, naming where it is.
TEST(SequenceBlocks, ATailThatIsNotFiniteIsRefused) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const kvblock::LatentLayout layout = Layout();
  const runtime::SequenceCache source = RandomCache(layout, 0, rng.engine(), 5);
  const size_t row = size_t{layout.kv_lora_rank} + layout.rope_dim;
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::string tail = TailBytes(source);
    const size_t at = rng.engine()() % (tail.size() / sizeof(float));
    std::memcpy(tail.data() + at * sizeof(float), &bad, sizeof bad);
    runtime::SequenceCache cache = EmptyCache(layout);
    const absl::Status s = SetTail(tail, "", 5, layout, cache);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    const size_t layer = at / (5 * row), token = at % (5 * row) / row;
    EXPECT_NE(s.message().find(
                  absl::StrCat("tail latent ", at % row, " of token ", token, " in layer ", layer, " is not finite")),
              std::string::npos)
        << s;
  }
}

// DeepSeek-V3.2: a block's record carries its tokens' indexer keys beside
// the latents, and a restored cache holds the very keys the source held.
TEST(SequenceBlocks, IndexerKeysTravelWithTheirBlock) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const kvblock::LatentLayout layout = IndexedLayout();
  const runtime::SequenceCache source = RandomCache(layout, 3, rng.engine(), 5);
  runtime::SequenceCache copy = EmptyCache(layout);
  for (size_t b = 0; b < 3; ++b) {
    absl::StatusOr<std::string> record = BlockRecord(layout, source, b, 0, layout.num_layers);
    ASSERT_TRUE(record.ok()) << record.status();
    EXPECT_EQ(record->size(), kvblock::HeaderFor(layout, 0, layout.num_layers).RecordBytes());
    ASSERT_TRUE(AppendBlockRecord(std::make_shared<const std::string>(*record), layout, copy).ok());
  }
  ASSERT_TRUE(SetTail(TailBytes(source), TailIndexerKeys(source, layout), 5, layout, copy).ok());
  EXPECT_EQ(copy.length, source.length);
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    EXPECT_EQ(copy.blocks[l], source.blocks[l]) << "layer " << l;
    EXPECT_EQ(copy.index_keys[l], source.index_keys[l]) << "layer " << l;
    EXPECT_EQ(copy.index_scales[l], source.index_scales[l]) << "layer " << l;
    EXPECT_EQ(copy.tail[l], source.tail[l]) << "layer " << l;
  }
  // A layer slice (what a prefill node streams) carries its layer's keys.
  const std::string slice = *BlockRecord(layout, source, 1, 2, 1);
  absl::StatusOr<kvblock::BlockView> view = kvblock::ParseBlock(slice, &layout);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(std::memcmp(view->IndexerPart(0).data(), source.index_keys[2].data() + 16 * 32, 16 * 32), 0);
  EXPECT_EQ(std::memcmp(view->IndexerPart(0).data() + 16 * 32, source.index_scales[2].data() + 16, 16 * 4), 0);
}

// A block whose indexer part was damaged is never restored: a changed byte
// is DATA_LOSS, and keys the model could not have made (a NaN code, a
// scale that is zero, negative or not finite) under a valid CRC are
// INVALID_ARGUMENT; either way the cache keeps what it had.
TEST(SequenceBlocks, DamagedIndexerKeysAreRefusedAndChangeNothing) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const kvblock::LatentLayout layout = IndexedLayout();
  const runtime::SequenceCache source = RandomCache(layout, 2, rng.engine());
  runtime::SequenceCache cache = EmptyCache(layout);
  ASSERT_TRUE(
      AppendBlockRecord(std::make_shared<const std::string>(*BlockRecord(layout, source, 0, 0, 3)), layout, cache)
          .ok());
  const std::string record = *BlockRecord(layout, source, 1, 0, 3);
  const size_t header = kvblock::kIndexedBlockHeaderBytes, latent = layout.LatentPartBytes(),
               keys = size_t{layout.tokens_per_block} * layout.indexer_dim;
  const auto layer_at = [&](uint32_t l) { return header + l * layout.LayerPayloadBytes(); };
  const uint32_t l = static_cast<uint32_t>(rng.engine()() % layout.num_layers);
  const size_t token = rng.engine()() % layout.tokens_per_block;
  std::vector<std::pair<std::string, absl::StatusCode>> damaged;
  std::string flipped = record;
  flipped[layer_at(l) + latent + rng.engine()() % layout.IndexerPartBytes()] ^= 0x20;
  damaged.push_back({flipped, absl::StatusCode::kDataLoss});
  for (uint8_t nan : {0x7f, 0xff}) {
    std::string r = record;
    r[layer_at(l) + latent + token * layout.indexer_dim + rng.engine()() % layout.indexer_dim] = static_cast<char>(nan);
    Reseal(r);
    damaged.push_back({r, absl::StatusCode::kInvalidArgument});
  }
  for (float scale : {0.0f, -1.0f, INFINITY, NAN}) {
    std::string r = record;
    std::memcpy(r.data() + layer_at(l) + latent + keys + token * sizeof(float), &scale, sizeof scale);
    Reseal(r);
    damaged.push_back({r, absl::StatusCode::kInvalidArgument});
  }
  for (const auto& [bytes, want] : damaged) {
    EXPECT_EQ(AppendBlockRecord(std::make_shared<const std::string>(bytes), layout, cache).code(), want);
    EXPECT_EQ(cache.length, 16);
    for (uint32_t k = 0; k < layout.num_layers; ++k) {
      EXPECT_EQ(cache.blocks[k].size(), 1u);
      EXPECT_EQ(cache.index_scales[k].size(), 16u) << "layer " << k;
      EXPECT_EQ(cache.index_keys[k].size(), 16u * layout.indexer_dim) << "layer " << k;
    }
  }
  // A tail whose keys are missing, short or damaged is refused too.
  const runtime::SequenceCache with_tail = RandomCache(layout, 0, rng.engine(), 3);
  std::string tail_keys = TailIndexerKeys(with_tail, layout);
  runtime::SequenceCache fresh = EmptyCache(layout);
  EXPECT_EQ(SetTail(TailBytes(with_tail), "", 3, layout, fresh).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetTail(TailBytes(with_tail), tail_keys.substr(1), 3, layout, fresh).code(),
            absl::StatusCode::kInvalidArgument);
  tail_keys[0] = 0x7f;
  EXPECT_EQ(SetTail(TailBytes(with_tail), tail_keys, 3, layout, fresh).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::serving
