// The absorbed runtime against the naive float64 model (expanded K/V, no
// absorption): logits at every position of a prompt that crosses block
// boundaries, for each preset and the config variants DESIGN.md lists.
#include "services/runtime/model.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "services/runtime/make_model.h"
#include "tests/reference/naive_model.h"
#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

namespace fs = std::filesystem;

// max |a - b| / max |b| over the row.
double RelativeError(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0, mag = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    mag = std::max(mag, std::fabs(b[i]));
  }
  return diff / mag;
}

struct Variant {
  std::string name;
  std::function<void(ModelConfig&)> change;
};

class ModelTest : public ::testing::TestWithParam<Variant> {
 protected:
  void TearDown() override { fs::remove_all(dir_); }
  testing::SeededRng rng_;
  fs::path dir_ = fs::temp_directory_path() / ("kvtier_model_" + std::to_string(rng_.seed()));
};

TEST_P(ModelTest, AbsorbedLogitsMatchTheNaiveModel) {
  SCOPED_TRACE(rng_.Trace());
  ModelConfig config = *PresetConfig("tiny");
  GetParam().change(config);
  ASSERT_TRUE(MakeModel(config, dir_.string(), rng_.seed()).ok());
  auto ckpt = Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto model = Model::Load(**ckpt);
  ASSERT_TRUE(model.ok()) << model.status();

  std::uniform_int_distribution<uint32_t> id(0, static_cast<uint32_t>(config.vocab_size - 1));
  std::vector<uint32_t> prompt(37);  // blocks of 16: sealed at 16 and 32, a partial tail
  for (auto& t : prompt) t = id(rng_.engine());
  constexpr uint32_t kBlock = 16;
  for (bool quantized : {false, true}) {
    SCOPED_TRACE(quantized ? "bf16 blocks of 16" : "float latents only");
    SequenceCache cache = (*model)->NewCache(kernels::Codec::kBf16, quantized ? kBlock : 4096);
    std::vector<std::vector<float>> got(prompt.size(), std::vector<float>(config.vocab_size));
    for (size_t p = 0; p < prompt.size(); ++p) ASSERT_TRUE((*model)->Step(prompt[p], cache, got[p]).ok());
    EXPECT_EQ(cache.blocks[0].size(), quantized ? 2u : 0u);
    const auto want = testing::NaiveLogits(**ckpt, prompt, quantized ? &cache : nullptr);
    for (size_t p = 0; p < prompt.size(); ++p) {
      ASSERT_LE(RelativeError(got[p], want[p]), 1e-4) << "position " << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ModelTest,
    ::testing::Values(
        Variant{"tiny", [](ModelConfig&) {}},
        Variant{"q_proj_greedy_norm_topk_freq2_no_rope_scaling",
                [](ModelConfig& c) {
                  c.q_lora_rank.reset();
                  c.topk_method = TopkMethod::kGreedy;
                  c.norm_topk_prob = true;
                  c.moe_layer_freq = 2;
                  c.num_hidden_layers = 4;
                  c.rope_scaling.reset();
                }},
        Variant{"scaled_routing_top1_no_shared",
                [](ModelConfig& c) {
                  c.num_experts_per_tok = 1;
                  c.norm_topk_prob = true;  // ignored for top-1, as in DeepSeek-V2
                  c.routed_scaling_factor = 2.5;
                  c.n_shared_experts = 0;
                  c.first_k_dense_replace = 0;
                }}),
    [](const auto& info) { return info.param.name; });

// A prompt in one causal pass (full-precision latents throughout, blocks
// sealed at the end), then decode steps over the sealed blocks.
TEST(Model, PrefillThenDecodeMatchTheNaiveModel) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const fs::path dir = fs::temp_directory_path() / ("kvtier_model_prefill_" + std::to_string(rng.seed()));
  ASSERT_TRUE(MakeModel(*PresetConfig("tiny"), dir.string(), rng.seed()).ok());
  auto ckpt = Checkpoint::Open(dir.string());
  auto model = Model::Load(**ckpt);
  ASSERT_TRUE(model.ok());
  std::uniform_int_distribution<uint32_t> id(0, 255);
  std::vector<uint32_t> tokens(47);  // 37 prompt + 10 decoded
  for (auto& t : tokens) t = id(rng.engine());
  const std::vector<uint32_t> prompt(tokens.begin(), tokens.begin() + 37);

  SequenceCache cache = (*model)->NewCache(kernels::Codec::kInt8, 16);
  std::vector<float> logits(256);
  ASSERT_TRUE((*model)->Prefill(prompt, cache, logits).ok());
  EXPECT_EQ(cache.length, 37);
  EXPECT_EQ(cache.blocks[0].size(), 2u);
  EXPECT_EQ(cache.tail[0].size(), 5u * (32 + 8));
  const auto full_precision = testing::NaiveLogits(**ckpt, prompt);
  EXPECT_LE(RelativeError(logits, full_precision.back()), 1e-4);

  std::vector<std::vector<float>> decoded;
  for (size_t p = 37; p < tokens.size(); ++p) {
    decoded.emplace_back(256);
    ASSERT_TRUE((*model)->Step(tokens[p], cache, decoded.back()).ok());
  }
  EXPECT_EQ(cache.blocks[0].size(), 2u + (47 - 32) / 16);
  const auto stored = testing::NaiveLogits(**ckpt, tokens, &cache, /*stored_from=*/37);
  for (size_t p = 37; p < tokens.size(); ++p) {
    ASSERT_LE(RelativeError(decoded[p - 37], stored[p]), 1e-4) << "position " << p;
  }
  EXPECT_EQ((*model)->Prefill({}, cache, logits).code(), absl::StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

// DeepSeek-V2-Lite's attention dims (16 heads, 512 + 64, 128 nope/v) with
// YaRN, through blocks of 8 so a short prompt crosses several.
TEST(Model, LiteAttnPresetMatchesTheNaiveModel) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const fs::path dir = fs::temp_directory_path() / ("kvtier_model_lite_" + std::to_string(rng.seed()));
  ASSERT_TRUE(MakeModel(*PresetConfig("lite-attn"), dir.string(), rng.seed()).ok());
  auto ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto model = Model::Load(**ckpt);
  ASSERT_TRUE(model.ok());
  std::uniform_int_distribution<uint32_t> id(0, 1023);
  std::vector<uint32_t> prompt(19);
  for (auto& t : prompt) t = id(rng.engine());
  SequenceCache cache = (*model)->NewCache(kernels::Codec::kBf16, 8);
  std::vector<std::vector<float>> got(prompt.size(), std::vector<float>(1024));
  for (size_t p = 0; p < prompt.size(); ++p) ASSERT_TRUE((*model)->Step(prompt[p], cache, got[p]).ok());
  const auto want = testing::NaiveLogits(**ckpt, prompt, &cache);
  for (size_t p = 0; p < prompt.size(); ++p) {
    ASSERT_LE(RelativeError(got[p], want[p]), 1e-4) << "position " << p;
  }
  fs::remove_all(dir);
}

TEST(Model, RejectsTokensOutsideTheVocabulary) {
  const fs::path dir = fs::temp_directory_path() / ("kvtier_model_vocab_" + std::to_string(getpid()));
  ASSERT_TRUE(MakeModel(*PresetConfig("tiny"), dir.string(), 1).ok());
  auto ckpt = Checkpoint::Open(dir.string());
  auto model = Model::Load(**ckpt);
  ASSERT_TRUE(model.ok());
  SequenceCache cache = (*model)->NewCache(kernels::Codec::kInt8, 64);
  std::vector<float> logits(256);
  EXPECT_EQ((*model)->Step(256, cache, logits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.length, 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvtier::runtime
