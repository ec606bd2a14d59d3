#include "services/runtime/cache_mark.h"

#include <gtest/gtest.h>

#include <random>

#include "services/runtime/checkpoint.h"
#include "services/runtime/make_model.h"
#include "tests/temp_dir.h"
#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

// `preset`'s random model of `seed`, its checkpoint written in `dir`; null
// when that fails.
std::unique_ptr<Model> PresetModel(const std::string& preset, uint64_t seed, const testing::TempDir& dir) {
  if (!MakeModel(*PresetConfig(preset), dir.path().string(), seed).ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir.path().string());
  if (!checkpoint.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(**checkpoint);
  return model.ok() ? *std::move(model) : nullptr;
}

// Same length, the same sealed blocks (by id: the originals, not copies of
// their bytes) and bit-identical tails.
void ExpectSameCache(const SequenceCache& got, const SequenceCache& want) {
  EXPECT_EQ(got.length, want.length);
  ASSERT_EQ(got.blocks.size(), want.blocks.size());
  for (size_t l = 0; l < want.blocks.size(); ++l) {
    ASSERT_EQ(got.blocks[l].size(), want.blocks[l].size()) << "layer " << l;
    for (size_t b = 0; b < want.blocks[l].size(); ++b) EXPECT_EQ(got.blocks[l][b].id(), want.blocks[l][b].id());
    EXPECT_EQ(got.tail[l], want.tail[l]) << "layer " << l;
  }
}

// A pass undone leaves the cache as it was, whether the pass sealed a block
// (the prompt ends one token short of a block) or not, and whether it ran
// to the end or stopped part way (one layer's latents appended); the
// undone cache then steps to the same logits as one never touched.
TEST(CacheMark, UndoingAPassRestoresTheCacheExactly) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const testing::TempDir dir("kvtier_cache_mark");
  const std::unique_ptr<Model> model = PresetModel("tiny", rng.seed(), dir);
  ASSERT_NE(model, nullptr);
  const size_t vocab = static_cast<size_t>(model->config().vocab_size);
  std::uniform_int_distribution<uint32_t> token(0, static_cast<uint32_t>(vocab - 1));
  constexpr uint32_t kBlock = 16;
  for (const uint32_t prompt_length : {kBlock - 1, 2 * kBlock + 5}) {
    for (const bool part_way : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "prompt " << prompt_length << (part_way ? ", part way" : ", whole pass"));
      SequenceCache cache = model->NewCache(kernels::Codec::kInt8, kBlock);
      std::vector<uint32_t> prompt(prompt_length);
      for (uint32_t& t : prompt) t = token(rng.engine());
      std::vector<float> logits(vocab);
      ASSERT_TRUE(model->Prefill(prompt, cache, logits).ok());
      const SequenceCache before = cache;

      CacheMark mark = MarkCache(cache, 1, model->config());
      if (part_way) {
        const auto& c = model->config();
        cache.tail[0].insert(cache.tail[0].end(), c.kv_lora_rank + c.qk_rope_head_dim, 1.0f);
      } else {
        ASSERT_TRUE(model->Step(token(rng.engine()), cache, logits).ok());
        if (prompt_length == kBlock - 1) {
          ASSERT_EQ(cache.blocks[0].size(), before.blocks[0].size() + 1) << "the pass sealed a block";
        }
      }
      UndoToMark(cache, std::move(mark), model->config());
      ExpectSameCache(cache, before);

      SequenceCache untouched = before;
      std::vector<float> want(vocab);
      const uint32_t next = token(rng.engine());
      ASSERT_TRUE(model->Step(next, untouched, want).ok());
      ASSERT_TRUE(model->Step(next, cache, logits).ok());
      EXPECT_EQ(logits, want);
    }
  }
}

void ExpectSameCompressor(const V4CompressorState& got, const V4CompressorState& want) {
  EXPECT_EQ(got.kv, want.kv);
  EXPECT_EQ(got.score, want.score);
  EXPECT_EQ(got.previous_kv, want.previous_kv);
  EXPECT_EQ(got.previous_score, want.previous_score);
}

// A DeepSeek-V4 sequence likewise: passes of 1 and 3 tokens, from lengths
// where the window has wrapped and groups close (ratios 4 and 8) or stay
// open, undone, leave every layer's window, compressed entries, keys and
// open rows as they were, and the next step's logits as a fresh copy's.
TEST(CacheMark, UndoingAV4PassRestoresItsStateExactly) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const testing::TempDir dir("kvtier_cache_mark_v4");
  const std::unique_ptr<Model> model = PresetModel("v4-tiny", rng.seed(), dir);
  ASSERT_NE(model, nullptr);
  const ModelConfig& config = model->config();
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  std::uniform_int_distribution<uint32_t> token(0, static_cast<uint32_t>(vocab - 1));
  for (const uint32_t prompt_length : {7u, 19u, 31u}) {
    for (const size_t pass : {size_t{1}, size_t{3}}) {
      SCOPED_TRACE(::testing::Message() << "prompt " << prompt_length << ", pass of " << pass);
      SequenceCache cache = model->NewCache(kernels::Codec::kFp8, 16);
      std::vector<uint32_t> prompt(prompt_length);
      for (uint32_t& t : prompt) t = token(rng.engine());
      std::vector<float> logits(vocab);
      ASSERT_TRUE(model->Prefill(prompt, cache, logits).ok());
      const SequenceCache before = cache;

      CacheMark mark = MarkCache(cache, pass, config);
      std::vector<uint32_t> more(pass);
      for (uint32_t& t : more) t = token(rng.engine());
      ASSERT_TRUE(model->Prefill(more, cache, logits).ok());
      UndoToMark(cache, std::move(mark), config);
      EXPECT_EQ(cache.length, before.length);
      ASSERT_EQ(cache.v4.size(), before.v4.size());
      for (size_t l = 0; l < before.v4.size(); ++l) {
        SCOPED_TRACE(::testing::Message() << "layer " << l);
        EXPECT_EQ(cache.v4[l].window, before.v4[l].window);
        EXPECT_EQ(cache.v4[l].compressed, before.v4[l].compressed);
        EXPECT_EQ(cache.v4[l].index_keys, before.v4[l].index_keys);
        ExpectSameCompressor(cache.v4[l].compressor, before.v4[l].compressor);
        ExpectSameCompressor(cache.v4[l].index_compressor, before.v4[l].index_compressor);
      }
      SequenceCache untouched = before;
      std::vector<float> want(vocab);
      const uint32_t next = token(rng.engine());
      ASSERT_TRUE(model->Step(next, untouched, want).ok());
      ASSERT_TRUE(model->Step(next, cache, logits).ok());
      EXPECT_EQ(logits, want);
    }
  }
}

}  // namespace
}  // namespace kvtier::runtime
