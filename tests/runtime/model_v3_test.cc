// The V3 family (DeepSeek-V3's, Kimi-K2's and V3.2's configs, FP8
// block-scaled projections as published, the noaux_tc router, V3.2's
// sparse attention) against the naive float64 model, whose FP8
// dequantization, router and indexer are written apart from the engine's:
// logits within 1e-4 of the largest at every position and greedy ids
// equal, through stored blocks and a prefill then decode steps (v32-tiny's
// index_topk 8 makes 37-token prompts attend sparsely from their 9th
// token on). Fresh weights and prompts every run.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "services/runtime/make_model.h"
#include "services/runtime/model.h"
#include "services/runtime/model_tensors.h"
#include "services/runtime/model_weights.h"
#include "services/runtime/safetensors.h"
#include "tests/reference/naive_model.h"
#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

namespace fs = std::filesystem;

constexpr double kLogitTolerance = 1e-4;

using testing::RelativeError;

template <typename T>
size_t ArgMax(const std::vector<T>& v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// A preset's checkpoint, generated with fresh weights and loaded.
class PresetModelTest : public ::testing::Test {
 protected:
  void Load(const std::string& preset, int shards) {
    config_ = *PresetConfig(preset);
    ASSERT_TRUE(MakeModel(config_, dir_.string(), rng_.seed(), shards).ok());
    auto ckpt = Checkpoint::Open(dir_.string());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = *std::move(ckpt);
    auto model = Model::Load(*ckpt_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<uint32_t> RandomTokens(size_t n) { return rng_.Tokens(n, config_.vocab_size); }

  testing::SeededRng rng_;
  fs::path dir_ = fs::temp_directory_path() / ("kvtier_model_v3_" + std::to_string(rng_.seed()));
  ModelConfig config_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<Model> model_;
};

// Every preset of the family, sharded as published.
class ModelV3Test : public PresetModelTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override { Load(GetParam(), PublishedShards(*PresetConfig(GetParam()))); }
};

// The preset is what it claims: FP8 projections with block scales of
// partial blocks, sharded, the router's bias in F32, the MTP layer written
// and skipped.
TEST_P(ModelV3Test, CheckpointIsAsPublished) {
  const LayerTensors moe = LayerTensorsOf(config_, config_.num_hidden_layers - 1);
  auto kv_a = ckpt_->Tensor(moe.kv_a.name);
  ASSERT_TRUE(kv_a.ok());
  EXPECT_EQ(kv_a->dtype, DType::kF8E4m3);
  const TensorSpec scales = ScaleSpec(moe.kv_a, *config_.fp8);
  auto kv_a_scales = ckpt_->Tensor(scales.name);
  ASSERT_TRUE(kv_a_scales.ok()) << kv_a_scales.status();
  EXPECT_EQ(kv_a_scales->dtype, DType::kF32);
  EXPECT_EQ(kv_a_scales->shape, (std::vector<int64_t>{1, (config_.hidden_size + 127) / 128}));
  EXPECT_NE(config_.hidden_size % 128, 0) << "edge blocks are partial";
  EXPECT_EQ(ckpt_->Tensor(moe.router->name)->dtype, DType::kBf16);
  EXPECT_EQ(ckpt_->Tensor(moe.correction_bias->name)->dtype, DType::kF32);
  EXPECT_EQ(ckpt_->Tensor(GlobalTensorsOf(config_).embed.name)->dtype, DType::kBf16);
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors.index.json"));
  std::ifstream index(dir_ / "model.safetensors.index.json");
  const std::string text((std::istreambuf_iterator<char>(index)), std::istreambuf_iterator<char>());
  const std::string mtp = "model.layers." + std::to_string(config_.num_hidden_layers) + ".eh_proj.weight";
  EXPECT_EQ(text.find(mtp) != std::string::npos, config_.num_nextn_predict_layers > 0);
  EXPECT_FALSE(ckpt_->Tensor(mtp).ok()) << "the MTP layer is skipped";
  // An expert kept in FP8: a quarter of float32's bytes and half of bf16's,
  // plus its scales.
  const MlpTensors expert = ExpertTensors(config_, config_.num_hidden_layers - 1, 0);
  auto w = LoadMatrix(*ckpt_, expert.down);
  ASSERT_TRUE(w.ok()) << w.status();
  const size_t elements = static_cast<size_t>(expert.down.shape[0] * expert.down.shape[1]);
  EXPECT_EQ(w->fp8.size(), elements);
  EXPECT_LE(w->bytes(), elements + 4 * 4u);
}

// Token by token through bf16 blocks of 16 (sealed at 16 and 32), the
// naive model attending over the same stored latents; then greedy
// decoding: the engine's ids are the naive model's argmax.
TEST_P(ModelV3Test, StepsAndGreedyIdsMatchTheNaiveModel) {
  SCOPED_TRACE(rng_.Trace());
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  std::vector<uint32_t> tokens = RandomTokens(37);
  SequenceCache cache = model_->NewCache(kernels::Codec::kBf16, 16);
  std::vector<std::vector<float>> got;
  for (size_t p = 0; p < 45; ++p) {
    got.emplace_back(vocab);
    ASSERT_TRUE(model_->Step(tokens[p], cache, got.back()).ok());
    if (p + 1 == tokens.size() && tokens.size() < 45) tokens.push_back(static_cast<uint32_t>(ArgMax(got.back())));
  }
  EXPECT_EQ(cache.blocks[0].size(), 2u);
  const auto want = testing::NaiveLogits(*ckpt_, tokens, &cache);
  for (size_t p = 0; p < tokens.size(); ++p) {
    ASSERT_LE(RelativeError(got[p], want[p]), kLogitTolerance) << "position " << p;
    if (p >= 36 && p + 1 < tokens.size()) {
      EXPECT_EQ(tokens[p + 1], ArgMax(want[p])) << "greedy id after position " << p;
    }
  }
}

// A 37-token prompt in one causal pass on float latents, then decode steps
// over int8 blocks.
TEST_P(ModelV3Test, PrefillThenDecodeMatchTheNaiveModel) {
  SCOPED_TRACE(rng_.Trace());
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  const std::vector<uint32_t> tokens = RandomTokens(45);
  const std::vector<uint32_t> prompt(tokens.begin(), tokens.begin() + 37);
  SequenceCache cache = model_->NewCache(kernels::Codec::kInt8, 16);
  std::vector<float> logits(vocab);
  ASSERT_TRUE(model_->Prefill(prompt, cache, logits).ok());
  EXPECT_LE(RelativeError(logits, testing::NaiveLogits(*ckpt_, prompt).back()), kLogitTolerance);
  std::vector<std::vector<float>> decoded;
  for (size_t p = 37; p < tokens.size(); ++p) {
    decoded.emplace_back(vocab);
    ASSERT_TRUE(model_->Step(tokens[p], cache, decoded.back()).ok());
  }
  const auto stored = testing::NaiveLogits(*ckpt_, tokens, &cache, /*stored_from=*/37);
  for (size_t p = 37; p < tokens.size(); ++p) {
    ASSERT_LE(RelativeError(decoded[p - 37], stored[p]), kLogitTolerance) << "position " << p;
  }
}

// DeepSeek's fp8_cast_bf16: every FP8 projection dequantized to bf16, the
// scales dropped, config.json as it was. It loads, and matches the naive
// model over its own (bf16) weights.
TEST_P(ModelV3Test, Bf16CastOfTheCheckpointLoads) {
  SCOPED_TRACE(rng_.Trace());
  const fs::path cast = dir_ / "bf16";
  fs::create_directories(cast);
  fs::copy_file(dir_ / "config.json", cast / "config.json");
  std::vector<TensorToWrite> tensors;
  ASSERT_TRUE(ForEachExpectedTensor(config_, [&](const TensorSpec& spec) -> absl::Status {
                auto values = LoadFloats(*ckpt_, spec);
                if (!values.ok()) return values.status();
                tensors.push_back({spec.name, spec.dtype == DType::kF32 ? DType::kF32 : DType::kBf16, spec.shape,
                                   *std::move(values)});
                return absl::OkStatus();
              }).ok());
  ASSERT_TRUE(WriteSafetensors((cast / "model.safetensors").string(), tensors).ok());
  auto ckpt = Checkpoint::Open(cast.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Tensor(LayerTensorsOf(config_, 0).kv_a.name)->dtype, DType::kBf16);
  auto model = Model::Load(**ckpt);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<uint32_t> prompt = RandomTokens(20);
  SequenceCache cache = (*model)->NewCache(kernels::Codec::kBf16, 4096);
  std::vector<float> logits(static_cast<size_t>(config_.vocab_size));
  ASSERT_TRUE((*model)->Prefill(prompt, cache, logits).ok());
  EXPECT_LE(RelativeError(logits, testing::NaiveLogits(**ckpt, prompt).back()), kLogitTolerance);
}

INSTANTIATE_TEST_SUITE_P(Presets, ModelV3Test, ::testing::Values("v3-tiny", "kimi-k2-tiny", "v32-tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// DeepSeek-V3.2's own: the indexer keys a sequence keeps, and the oracle,
// dense V3 over the same weights (one file, to copy beside an edited
// config).
class ModelV32Test : public PresetModelTest {
 protected:
  void SetUp() override { Load("v32-tiny", 1); }
};

// The keys a sequence's cache holds: one a token and layer, and a cache
// that lacks some is refused, not run over empty ones.
TEST_F(ModelV32Test, CachesHoldAKeyForEveryToken) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<uint32_t> prompt = RandomTokens(21);
  SequenceCache cache = model_->NewCache(kernels::Codec::kInt8, 16);
  std::vector<float> logits(static_cast<size_t>(config_.vocab_size));
  ASSERT_TRUE(model_->Prefill(prompt, cache, logits).ok());
  ASSERT_TRUE(model_->Step(prompt[0], cache, logits).ok());
  for (size_t l = 0; l < cache.index_scales.size(); ++l) {
    EXPECT_EQ(cache.index_scales[l].size(), 22u) << "layer " << l;
    EXPECT_EQ(cache.index_keys[l].size(), 22u * config_.indexer->head_dim) << "layer " << l;
  }
  SequenceCache keyless = cache;
  keyless.index_scales[1].pop_back();
  EXPECT_EQ(model_->Step(prompt[0], keyless, logits).code(), absl::StatusCode::kInvalidArgument);
}

// The oracle: with a context of at most index_topk tokens every token is
// chosen, and V3.2 is dense V3 over the same weights, bit for bit, in
// every codec.
TEST_F(ModelV32Test, WithinIndexTopkItIsDenseV3) {
  SCOPED_TRACE(rng_.Trace());
  const fs::path dense = dir_ / "as_v3", wide = dir_ / "wide_topk";
  for (const fs::path& d : {dense, wide}) {
    fs::create_directories(d);
    fs::copy_file(dir_ / "model.safetensors", d / "model.safetensors");
    std::ifstream in(dir_ / "config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    if (d == dense) {
      j["model_type"] = "deepseek_v3";
      j["architectures"] = {"DeepseekV3ForCausalLM"};
    } else {
      j["index_topk"] = 64;
    }
    std::ofstream(d / "config.json") << j.dump();
  }
  auto v3 = Checkpoint::Open(dense.string());
  auto v32 = Checkpoint::Open(wide.string());
  ASSERT_TRUE(v3.ok() && v32.ok()) << v3.status() << " " << v32.status();
  auto dense_model = Model::Load(**v3);
  auto sparse_model = Model::Load(**v32);
  ASSERT_TRUE(dense_model.ok() && sparse_model.ok());
  const std::vector<uint32_t> prompt = RandomTokens(37);
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  for (kernels::Codec codec :
       {kernels::Codec::kBf16, kernels::Codec::kFp8, kernels::Codec::kInt8, kernels::Codec::kInt4}) {
    SCOPED_TRACE(kernels::CodecName(codec));
    SequenceCache a = (*dense_model)->NewCache(codec, 16), b = (*sparse_model)->NewCache(codec, 16);
    std::vector<float> la(vocab), lb(vocab);
    ASSERT_TRUE((*dense_model)->Prefill(std::span(prompt).first(20), a, la).ok());
    ASSERT_TRUE((*sparse_model)->Prefill(std::span(prompt).first(20), b, lb).ok());
    EXPECT_EQ(la, lb);
    for (size_t p = 20; p < prompt.size(); ++p) {
      ASSERT_TRUE((*dense_model)->Step(prompt[p], a, la).ok());
      ASSERT_TRUE((*sparse_model)->Step(prompt[p], b, lb).ok());
      ASSERT_EQ(la, lb) << "position " << p;
    }
  }
}

}  // namespace
}  // namespace kvtier::runtime
