// DeepSeek-V3.2's sparse attention in process: the indexer keys each
// sequence keeps, and the oracle, dense V3 over the same weights. (Against
// the naive float64 model, with its own indexer: model_v3_test's v32-tiny
// runs, where index_topk 8 makes prompts of 37 tokens attend sparsely from
// their 9th token on.)
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "services/runtime/make_model.h"
#include "services/runtime/model.h"
#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

namespace fs = std::filesystem;
class ModelV32Test : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = *PresetConfig("v32-tiny");
    ASSERT_TRUE(MakeModel(config_, dir_.string(), rng_.seed(), 1).ok());
    auto ckpt = Checkpoint::Open(dir_.string());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = *std::move(ckpt);
    auto model = Model::Load(*ckpt_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<uint32_t> RandomTokens(size_t n) {
    std::uniform_int_distribution<uint32_t> id(0, static_cast<uint32_t>(config_.vocab_size - 1));
    std::vector<uint32_t> tokens(n);
    for (uint32_t& t : tokens) t = id(rng_.engine());
    return tokens;
  }

  testing::SeededRng rng_;
  fs::path dir_ = fs::temp_directory_path() / ("kvtier_model_v32_" + std::to_string(rng_.seed()));
  ModelConfig config_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<Model> model_;
};

// The keys a sequence's cache holds: one a token and layer, and a cache
// that lacks some is refused, not run over empty ones. (The sparse steps
// against the naive model: model_v3_test, whose presets include v32-tiny.)
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
