// DeepSeek-V4's cache parts: entries and indexer keys in their byte
// formats come back bit for bit; a sequence cut into blocks and a restore
// point at any block boundary continues exactly as the uninterrupted run;
// parts that do not fit are refused with the cache untouched. Fresh
// weights, prompts and values every run.
#include "services/runtime/v4_cache_parts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/qat_rounding.h"
#include "kvtier/kernels/v4_entry.h"
#include "services/runtime/make_model.h"
#include "tests/temp_dir.h"
#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

// The first `count` parts' bytes (all by default), as RestoreV4 takes them.
std::vector<std::span<const uint8_t>> Views(const std::vector<std::vector<uint8_t>>& parts, size_t count = SIZE_MAX) {
  return {parts.begin(), parts.begin() + static_cast<ptrdiff_t>(std::min(count, parts.size()))};
}

// Values as the model leaves an entry: FP8-rounded non-rotated dims (blocks
// of 64), bf16 rotated ones, at a random magnitude.
std::vector<float> ModelEntry(std::mt19937_64& rng, size_t dim, size_t rope_dim) {
  std::normal_distribution<float> normal;
  const float magnitude = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
  std::vector<float> v(dim);
  for (float& x : v) x = normal(rng) * magnitude;
  kernels::RoundThroughFp8(std::span(v).first(dim - rope_dim), 64);
  for (size_t i = dim - rope_dim; i < dim; ++i) v[i] = kernels::Bf16ToFloat(kernels::FloatToBf16(v[i]));
  return v;
}

TEST(V4EntryTest, ModelRoundedValuesComeBackBitForBit) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  EXPECT_EQ(kernels::V4EntryBytes(512, 64), 584u);
  EXPECT_EQ(kernels::V4IndexKeyBytes(128), 68u);
  std::vector<uint8_t> bytes(584), key_bytes(68);
  std::vector<float> back(512), key_back(128);
  for (int trial = 0; trial < 100; ++trial) {
    const std::vector<float> entry = ModelEntry(rng.engine(), 512, 64);
    ASSERT_TRUE(kernels::EncodeV4Entry(entry, 64, bytes).ok());
    ASSERT_TRUE(kernels::DecodeV4Entry(bytes, 64, back).ok());
    for (size_t i = 0; i < entry.size(); ++i) ASSERT_EQ(kernels::FloatBits(back[i]), kernels::FloatBits(entry[i])) << i;
    std::vector<float> key = ModelEntry(rng.engine(), 128, 0);
    kernels::RoundThroughFp4(key, 32);
    ASSERT_TRUE(kernels::EncodeV4IndexKey(key, key_bytes).ok());
    ASSERT_TRUE(kernels::DecodeV4IndexKey(key_bytes, key_back).ok());
    for (size_t i = 0; i < key.size(); ++i) ASSERT_EQ(kernels::FloatBits(key_back[i]), kernels::FloatBits(key[i])) << i;
  }
  // MXFP4 as published: the first value in the low nibble, a sign bit
  // over the magnitude's index, one E8M0 scale (2^(byte - 127)) per 32.
  std::vector<float> key(128, 0.0f);
  key[0] = 1.0f;    // index 2
  key[1] = -6.0f;   // sign, index 7
  key[32] = 0.25f;  // a block of scale 2^-4: 4.0, index 6
  ASSERT_TRUE(kernels::EncodeV4IndexKey(key, key_bytes).ok());
  EXPECT_EQ(key_bytes[0], 0xf2);
  EXPECT_EQ(key_bytes[16], 0x06);
  EXPECT_EQ(key_bytes[64], 127);      // scale 1
  EXPECT_EQ(key_bytes[65], 127 - 4);  // 2^-4
}

TEST(V4EntryTest, ValuesTheFormatsCannotHoldAreRefused) {
  std::vector<float> entry(512, 0.5f);
  std::vector<uint8_t> bytes(584), key_bytes(68);
  ASSERT_TRUE(kernels::EncodeV4Entry(entry, 64, bytes).ok());
  entry[3] = 0.5001f;  // off the FP8 grid of its block
  EXPECT_FALSE(kernels::EncodeV4Entry(entry, 64, bytes).ok());
  entry[3] = 0.5f;
  entry[500] = 1.0f + 1.0f / 1024;  // a rotated value finer than bf16
  EXPECT_FALSE(kernels::EncodeV4Entry(entry, 64, bytes).ok());
  std::vector<float> key(128, 1.0f);
  key[7] = 1.25f;  // between E2M1's 1 and 1.5
  EXPECT_FALSE(kernels::EncodeV4IndexKey(key, key_bytes).ok());
  // A NaN code or scale in stored bytes is refused, not decoded.
  std::vector<float> back(512);
  entry.assign(512, 0.5f);
  ASSERT_TRUE(kernels::EncodeV4Entry(entry, 64, bytes).ok());
  bytes[10] = 0x7f;
  EXPECT_FALSE(kernels::DecodeV4Entry(bytes, 64, back).ok());
  ASSERT_TRUE(kernels::EncodeV4Entry(entry, 64, bytes).ok());
  bytes[448] = 0xff;
  EXPECT_FALSE(kernels::DecodeV4Entry(bytes, 64, back).ok());
  // The pad byte is 0 in every entry an encoder wrote.
  ASSERT_TRUE(kernels::EncodeV4Entry(entry, 64, bytes).ok());
  EXPECT_EQ(bytes.back(), 0);
  bytes.back() = 1;
  EXPECT_FALSE(kernels::DecodeV4Entry(bytes, 64, back).ok());
  // Finite codes times the largest scale (2^127) are past float32's range:
  // refused too, for entries and keys (what fuzz_v4_restore found).
  ASSERT_TRUE(kernels::EncodeV4Entry(entry, 64, bytes).ok());
  bytes[448] = 0xfe;
  bytes[0] = 0x7e;  // 448 x 2^127
  EXPECT_FALSE(kernels::DecodeV4Entry(bytes, 64, back).ok());
  bytes[0] = 0x00;  // every code of the block 0 or 0.5 (0x30): 0.5 x 2^127 is finite
  for (size_t i = 1; i < 64; ++i) bytes[i] = 0x30;
  EXPECT_TRUE(kernels::DecodeV4Entry(bytes, 64, back).ok());
  // Under the smallest scale (2^-127) the values are float32 subnormals
  // or near them, and still encode, to the same bytes.
  bytes[448] = 0x00;
  for (size_t i = 0; i < 64; ++i) bytes[i] = static_cast<uint8_t>(i % 2 ? 0x05 : 0x83);  // subnormal codes
  bytes[7] = 0x56;                                                                       // 1.25 x 2^3
  ASSERT_TRUE(kernels::DecodeV4Entry(bytes, 64, back).ok());
  std::vector<uint8_t> again(584);
  ASSERT_TRUE(kernels::EncodeV4Entry(back, 64, again).ok());
  EXPECT_EQ(again, bytes);
  key.assign(128, 1.0f);
  ASSERT_TRUE(kernels::EncodeV4IndexKey(key, key_bytes).ok());
  std::vector<float> key_back(128);
  key_bytes[0] = 0x07;   // 6.0
  key_bytes[64] = 0xfe;  // times 2^127
  EXPECT_FALSE(kernels::DecodeV4IndexKey(key_bytes, key_back).ok());
}

class V4CachePartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = *PresetConfig("v4-tiny");
    ASSERT_TRUE(MakeModel(config_, dir_.path().string(), rng_.seed()).ok());
    ckpt_ = *Checkpoint::Open(dir_.path().string());
    model_ = *Model::Load(*ckpt_);
  }
  std::vector<uint32_t> RandomTokens(size_t n) { return rng_.Tokens(n, config_.vocab_size); }
  // Logits after each of `tokens` from position `from` on, one pass for
  // the first `first_pass` of them, then a step each.
  std::vector<std::vector<float>> Continue(SequenceCache& cache, const std::vector<uint32_t>& tokens, size_t from,
                                           size_t first_pass) {
    std::vector<std::vector<float>> logits;
    std::vector<float> l(config_.vocab_size);
    EXPECT_TRUE(model_->Prefill(std::span(tokens).subspan(from, first_pass), cache, l).ok());
    logits.push_back(l);
    for (size_t i = from + first_pass; i < tokens.size(); ++i) {
      EXPECT_TRUE(model_->Step(tokens[i], cache, l).ok());
      logits.push_back(l);
    }
    return logits;
  }

  static constexpr uint32_t kBlock = 16;  // a multiple of v4-tiny's ratios (4, 8)
  testing::SeededRng rng_;
  testing::TempDir dir_{"kvtier_v4_parts_"};
  ModelConfig config_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<Model> model_;
};

// A 53-token prompt and 6 steps: cut at every boundary (16, 32, 48: past
// the 16-token window, with CSA and HCA groups closed), each restore
// continues with the uninterrupted run's logits, bit for bit.
TEST_F(V4CachePartsTest, ARestoreAtEveryBoundaryContinuesExactly) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<uint32_t> tokens = RandomTokens(59);
  constexpr size_t kPrompt = 53;
  SequenceCache whole = model_->NewCache(kernels::Codec::kBf16, kBlock);
  const std::vector<std::vector<float>> uninterrupted = Continue(whole, tokens, 0, kPrompt);

  // The same prompt in passes that end at the boundaries, cut as it goes.
  SequenceCache cut = model_->NewCache(kernels::Codec::kBf16, kBlock);
  std::vector<std::vector<uint8_t>> blocks, restore_points;
  std::vector<float> l(config_.vocab_size);
  for (size_t boundary = kBlock; boundary <= kPrompt; boundary += kBlock) {
    ASSERT_TRUE(model_->Prefill(std::span(tokens).subspan(boundary - kBlock, kBlock), cut, l).ok());
    absl::StatusOr<std::vector<uint8_t>> block = EncodeV4Block(config_, cut, blocks.size(), kBlock);
    absl::StatusOr<std::vector<uint8_t>> point = EncodeV4RestorePoint(config_, cut, kBlock);
    ASSERT_TRUE(block.ok()) << block.status();
    ASSERT_TRUE(point.ok()) << point.status();
    EXPECT_EQ(block->size(), V4BlockBytes(config_, kBlock));
    blocks.push_back(*std::move(block));
    restore_points.push_back(*std::move(point));
  }
  ASSERT_EQ(blocks.size(), 3u);
  for (size_t n = 1; n <= blocks.size(); ++n) {
    SequenceCache restored = model_->NewCache(kernels::Codec::kBf16, kBlock);
    ASSERT_TRUE(RestoreV4(config_, Views(blocks, n), restore_points[n - 1], kBlock, restored).ok());
    EXPECT_EQ(restored.length, static_cast<int64_t>(n * kBlock));
    const std::vector<std::vector<float>> continued = Continue(restored, tokens, n * kBlock, kPrompt - n * kBlock);
    ASSERT_EQ(continued.size(), uninterrupted.size());
    for (size_t i = 0; i < continued.size(); ++i) {
      EXPECT_EQ(continued[i], uninterrupted[i]) << "restored after " << n << " blocks, logits " << i;
    }
  }
  // What the restore point holds is needed: without layer 1's overlap rows
  // (zeroed: after the boundary, layer 0's window and layer 1's window) the
  // continuation differs.
  const size_t entry = kernels::V4EntryBytes(80, 16), rows = 4 * 80 * 2 * sizeof(float);
  std::vector<uint8_t> no_rows = restore_points[1];
  std::fill_n(no_rows.begin() + 8 + 2 * kBlock * entry, rows, 0);
  SequenceCache restored = model_->NewCache(kernels::Codec::kBf16, kBlock);
  ASSERT_TRUE(RestoreV4(config_, Views(blocks, 2), no_rows, kBlock, restored).ok());
  EXPECT_NE(Continue(restored, tokens, 2 * kBlock, kPrompt - 2 * kBlock).back(), uninterrupted.back());
}

TEST_F(V4CachePartsTest, PartsThatDoNotFitAreRefusedAndTheCacheIsUntouched) {
  SCOPED_TRACE(rng_.Trace());
  SequenceCache cache = model_->NewCache(kernels::Codec::kBf16, kBlock);
  std::vector<float> l(config_.vocab_size);
  ASSERT_TRUE(model_->Prefill(RandomTokens(2 * kBlock), cache, l).ok());
  std::vector<std::vector<uint8_t>> blocks = {*EncodeV4Block(config_, cache, 0, kBlock),
                                              *EncodeV4Block(config_, cache, 1, kBlock)};
  const std::vector<uint8_t> point = *EncodeV4RestorePoint(config_, cache, kBlock);
  EXPECT_FALSE(EncodeV4Block(config_, cache, 2, kBlock).ok()) << "not complete";
  EXPECT_FALSE(EncodeV4Block(config_, cache, 0, 12).ok()) << "12 is not a multiple of the ratio 8";
  ASSERT_TRUE(model_->Step(1, cache, l).ok());
  EXPECT_FALSE(EncodeV4RestorePoint(config_, cache, kBlock).ok()) << "not at a boundary";

  SequenceCache fresh = model_->NewCache(kernels::Codec::kBf16, kBlock);
  EXPECT_FALSE(RestoreV4(config_, Views(blocks, 1), point, kBlock, fresh).ok()) << "point after 2 blocks";
  std::vector<std::vector<uint8_t>> short_block = blocks;
  short_block[1].pop_back();
  EXPECT_FALSE(RestoreV4(config_, Views(short_block), point, kBlock, fresh).ok());
  std::vector<std::vector<uint8_t>> nan_code = blocks;
  nan_code[1][0] = 0x7f;  // layer 1's first compressed entry: a NaN FP8 code
  EXPECT_FALSE(RestoreV4(config_, Views(nan_code), point, kBlock, fresh).ok());
  // Layer 1's overlap rows (after both layers' windows of 16 entries),
  // float32 as stored: a NaN or an infinity is refused.
  const size_t rows_at = 8 + 2 * kBlock * kernels::V4EntryBytes(80, 16);
  for (const float bad : {std::nanf(""), -std::numeric_limits<float>::infinity()}) {
    std::vector<uint8_t> bad_rows = point;
    std::memcpy(bad_rows.data() + rows_at + 3 * sizeof(float), &bad, sizeof bad);
    EXPECT_FALSE(RestoreV4(config_, Views(blocks), bad_rows, kBlock, fresh).ok()) << bad;
  }
  EXPECT_EQ(fresh.length, 0);
  EXPECT_TRUE(fresh.v4[1].compressed.empty());
  ASSERT_TRUE(RestoreV4(config_, Views(blocks), point, kBlock, fresh).ok());
  EXPECT_EQ(fresh.length, static_cast<int64_t>(2 * kBlock));
}

// What a cached V4-Flash prefix costs, from its released dims: a 128-token
// block 449,824 bytes (3,514 a token), a restore point 3,644,424 bytes.
TEST(V4CachePartsSizeTest, V4FlashBytes) {
  ModelConfig c;
  c.model_type = ModelType::kDeepseekV4;
  c.num_hidden_layers = 43;
  c.qk_rope_head_dim = 64;
  c.indexer = IndexerConfig{64, 128, 512};
  V4Config& v4 = c.v4.emplace();
  v4.head_dim = 512;
  v4.sliding_window = 128;
  v4.compress_ratios = {0, 0};
  for (int i = 0; i < 20; ++i) v4.compress_ratios.insert(v4.compress_ratios.end(), {4, 128});
  v4.compress_ratios.push_back(4);
  // 21 CSA layers: 32 entries and 32 keys; 20 HCA layers: 1 entry.
  EXPECT_EQ(V4BlockBytes(c, 128), 21u * 32 * (584 + 68) + 20u * 584);
  EXPECT_EQ(V4BlockBytes(c, 128), 449'824u);
  // Its boundary; 43 layers' 128 window entries; 21 CSA layers' overlap
  // rows (4 x 512 and 4 x 128, kv and score, float32).
  EXPECT_EQ(V4RestorePointBytes(c, 4096), 8 + 43u * 128 * 584 + 21u * (4 * 512 + 4 * 128) * 2 * 4);
  EXPECT_EQ(V4RestorePointBytes(c, 4096), 3'644'424u);
  EXPECT_EQ(V4RestorePointBytes(c, 64), 8 + 43u * 64 * 584 + 21u * (4 * 512 + 4 * 128) * 2 * 4) << "a short prefix";
}

}  // namespace
}  // namespace kvtier::runtime
