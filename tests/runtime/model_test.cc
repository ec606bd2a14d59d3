// The absorbed runtime against the naive float64 model (expanded K/V, no
// absorption): logits at every position of a prompt that crosses block
// boundaries, for each preset and the config variants DESIGN.md lists.
#include "services/runtime/model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "services/runtime/make_model.h"
#include "services/runtime/model_tensors.h"
#include "services/runtime/safetensors.h"
#if KVTIER_RUNTIME_CUDA
#include "kvtier/kernels/cuda_codec.h"
#endif
#include "tests/reference/naive_model.h"
#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

namespace fs = std::filesystem;

using testing::RelativeError;

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

INSTANTIATE_TEST_SUITE_P(Configs, ModelTest,
                         ::testing::Values(Variant{"tiny", [](ModelConfig&) {}},
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

// --device cuda where it cannot run (no GPU, or a build without CUDA) is
// refused at load, saying why; cuda_forward_test covers it with a GPU.
TEST(Model, CudaIsRefusedClearlyWhereItCannotRun) {
#if KVTIER_RUNTIME_CUDA
  std::string why;
  if (kernels::cuda::DevicePresent(&why)) GTEST_SKIP() << "a GPU is present: cuda_forward_test runs --device cuda";
#endif
  const fs::path dir = fs::temp_directory_path() / ("kvtier_model_cuda_" + std::to_string(getpid()));
  ASSERT_TRUE(MakeModel(*PresetConfig("tiny"), dir.string(), 3).ok());
  auto ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto model = Model::Load(**ckpt, Device::kCuda);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(model.status().message().find("--device cuda"), std::string::npos) << model.status();
  EXPECT_EQ(ParseDevice("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseDevice("cuda"), Device::kCuda);
  fs::remove_all(dir);
}

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

// The trained model that ships in models/ (a byte tokenizer, no YaRN, MoE
// after a dense layer) on a random stretch of its held-out text, through
// int8 blocks of 8: the naive model over the same stored latents agrees,
// and the text is far from random to it.
TEST(Model, TrainedModelMatchesTheNaiveModel) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const std::string dir = KVTIER_MODELS_DIR "/jargon-mla";
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->tokenizer_class(), "ByT5Tokenizer");
  auto model = Model::Load(**ckpt);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ((*model)->tokenizer_class(), "ByT5Tokenizer");
  std::ifstream in(dir + "/heldout.txt", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(text.size(), 1000u);
  const size_t start = std::uniform_int_distribution<size_t>(0, text.size() - 100)(rng.engine());
  std::vector<uint32_t> tokens;
  for (size_t i = start; i < start + 40; ++i) tokens.push_back(static_cast<unsigned char>(text[i]) + 3);
  SequenceCache cache = (*model)->NewCache(kernels::Codec::kInt8, 8);
  const size_t vocab = (*ckpt)->config().vocab_size;
  std::vector<std::vector<float>> got(tokens.size(), std::vector<float>(vocab));
  double nll = 0;
  for (size_t p = 0; p < tokens.size(); ++p) {
    ASSERT_TRUE((*model)->Step(tokens[p], cache, got[p]).ok());
    if (p + 1 < tokens.size()) {
      double sum = 0;
      for (float v : got[p]) sum += std::exp(double{v} - got[p][tokens[p + 1]]);
      nll += std::log(sum);
    }
  }
  const auto want = testing::NaiveLogits(**ckpt, tokens, &cache);
  for (size_t p = 0; p < tokens.size(); ++p) {
    ASSERT_LE(RelativeError(got[p], want[p]), 1e-4) << "position " << p;
  }
  // Uniform guessing would be 259 per byte; a trained model is far below.
  EXPECT_LT(std::exp(nll / static_cast<double>(tokens.size() - 1)), 40.0);
}

// A batch mixing prompts of different lengths (one crossing two blocks, one
// shorter than a block) with decode steps of sequences already holding
// sealed int4 blocks: each sequence's logits and latents are bit for bit
// those of running it alone, and the naive model agrees.
TEST(Model, BatchOfSequencesEqualsEachAlone) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const fs::path dir = fs::temp_directory_path() / ("kvtier_model_batch_" + std::to_string(rng.seed()));
  ASSERT_TRUE(MakeModel(*PresetConfig("tiny"), dir.string(), rng.seed()).ok());
  auto ckpt = Checkpoint::Open(dir.string());
  auto model = Model::Load(**ckpt);
  ASSERT_TRUE(model.ok());
  std::uniform_int_distribution<uint32_t> id(0, 255);
  auto random_tokens = [&](size_t n) {
    std::vector<uint32_t> t(n);
    for (auto& v : t) v = id(rng.engine());
    return t;
  };
  // Sequences 0 and 1 start fresh (prompts of 37 and 5); 2 and 3 first hold
  // 20 and 16 tokens, then take one decode token each.
  const std::vector<std::vector<uint32_t>> history = {{}, {}, random_tokens(20), random_tokens(16)};
  const std::vector<std::vector<uint32_t>> pass = {random_tokens(37), random_tokens(5), random_tokens(1),
                                                   random_tokens(1)};
  std::vector<SequenceCache> batched, alone;
  std::vector<float> scratch(256);
  for (size_t s = 0; s < history.size(); ++s) {
    batched.push_back((*model)->NewCache(kernels::Codec::kInt4, 16));
    if (!history[s].empty()) {
      ASSERT_TRUE((*model)->Prefill(history[s], batched.back(), scratch).ok());
    }
  }
  alone = batched;
  std::vector<SequenceCache> one_buffer_caches = batched;
  std::vector<std::vector<float>> got(4, std::vector<float>(256, NAN)), want = got;
  std::vector<SequenceTokens> batch;
  for (size_t s = 0; s < pass.size(); ++s) batch.push_back({pass[s], &batched[s], got[s]});
  ASSERT_TRUE((*model)->Forward(batch).ok());
  // The same pass with the logits in one buffer, row after row (as the
  // decode batcher keeps them; Forward writes straight into it): the same
  // bits.
  std::vector<float> one_buffer(4 * 256, NAN);
  std::vector<SequenceTokens> same_pass;
  for (size_t s = 0; s < pass.size(); ++s) {
    same_pass.push_back({pass[s], &one_buffer_caches[s], std::span(one_buffer).subspan(s * 256, 256)});
  }
  ASSERT_TRUE((*model)->Forward(same_pass).ok());
  for (size_t s = 0; s < pass.size(); ++s) {
    EXPECT_EQ(std::vector<float>(one_buffer.begin() + s * 256, one_buffer.begin() + (s + 1) * 256), got[s]) << s;
    EXPECT_EQ(one_buffer_caches[s].length, batched[s].length);
  }
  for (size_t s = 0; s < pass.size(); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    ASSERT_TRUE((*model)->Prefill(pass[s], alone[s], want[s]).ok());
    EXPECT_EQ(got[s], want[s]);
    EXPECT_EQ(batched[s].length, alone[s].length);
    EXPECT_EQ(batched[s].blocks, alone[s].blocks);
    EXPECT_EQ(batched[s].tail, alone[s].tail);
  }
  EXPECT_EQ(batched[0].blocks[0].size(), 2u);
  EXPECT_EQ(batched[3].blocks[0].size(), 1u);
  std::vector<uint32_t> all = history[2];
  all.insert(all.end(), pass[2].begin(), pass[2].end());
  const auto naive = testing::NaiveLogits(**ckpt, all, &batched[2], /*stored_from=*/20);
  EXPECT_LE(RelativeError(got[2], naive.back()), 1e-4);

  // Bad batches change nothing.
  const SequenceCache before = batched[0];
  const std::vector<uint32_t> one = {1};
  EXPECT_EQ((*model)->Forward({}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<SequenceTokens> twice = {{one, &batched[0], got[0]}, {one, &batched[0], got[1]}};
  EXPECT_EQ((*model)->Forward(twice).code(), absl::StatusCode::kInvalidArgument);
  std::vector<SequenceTokens> short_logits = {{one, &batched[0], std::span(got[0]).first(10)}};
  EXPECT_EQ((*model)->Forward(short_logits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batched[0].length, before.length);
  EXPECT_EQ(batched[0].tail, before.tail);
  fs::remove_all(dir);
}

// A checkpoint stored in float32 (the bf16 one's values, widened exactly)
// runs on float weights where the bf16 one keeps bf16: the same logits, bit
// for bit, through a prefill and decode steps.
TEST(Model, Float32CheckpointGivesTheBitsOfItsBf16Original) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const fs::path bf16_dir = fs::temp_directory_path() / ("kvtier_model_bf16_" + std::to_string(rng.seed()));
  const fs::path f32_dir = fs::temp_directory_path() / ("kvtier_model_f32_" + std::to_string(rng.seed()));
  const ModelConfig config = *PresetConfig("tiny");
  ASSERT_TRUE(MakeModel(config, bf16_dir.string(), rng.seed()).ok());
  auto bf16 = Checkpoint::Open(bf16_dir.string());
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  std::vector<TensorToWrite> widened;
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    absl::StatusOr<TensorView> t = (*bf16)->Tensor(spec.name);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->dtype, DType::kBf16);
    widened.push_back({spec.name, DType::kF32, spec.shape, t->ToFloat()});
  }
  fs::create_directories(f32_dir);
  fs::copy_file(bf16_dir / "config.json", f32_dir / "config.json");
  ASSERT_TRUE(WriteSafetensors((f32_dir / "model.safetensors").string(), widened).ok());
  auto f32 = Checkpoint::Open(f32_dir.string());
  ASSERT_TRUE(f32.ok()) << f32.status();

  std::vector<std::unique_ptr<Model>> models;
  for (const Checkpoint* c : {bf16->get(), f32->get()}) {
    auto model = Model::Load(*c);
    ASSERT_TRUE(model.ok()) << model.status();
    models.push_back(*std::move(model));
  }
  std::uniform_int_distribution<uint32_t> id(0, static_cast<uint32_t>(config.vocab_size - 1));
  std::vector<uint32_t> prompt(21);
  for (auto& t : prompt) t = id(rng.engine());
  std::vector<std::vector<float>> logits;
  for (const auto& model : models) {
    SequenceCache cache = model->NewCache(kernels::Codec::kInt8, 16);
    std::vector<float> row(config.vocab_size), all;
    ASSERT_TRUE(model->Prefill(prompt, cache, row).ok());
    all = row;
    for (uint32_t t : {7u, 99u, 3u}) {
      ASSERT_TRUE(model->Step(t, cache, row).ok());
      all.insert(all.end(), row.begin(), row.end());
    }
    logits.push_back(all);
  }
  EXPECT_EQ(logits[0], logits[1]);
  fs::remove_all(bf16_dir);
  fs::remove_all(f32_dir);
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
