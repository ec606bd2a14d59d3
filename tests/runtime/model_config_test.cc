// config.json as each family publishes it parses to the settings that
// decide the math, and every setting kvtier cannot run (or that no model
// could have) is refused with a message that names the field.
#include "services/runtime/model_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "services/runtime/make_model.h"
#include "services/runtime/model_tensors.h"

namespace kvtier::runtime {
namespace {

using nlohmann::json;

// DeepSeek-V3's config.json as published: the fields that decide the math.
json PublishedV3() {
  return json::parse(R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
      "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
      "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "num_attention_heads": 128,
      "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "ep_size": 1,
      "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
      "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": true,
      "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
      "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
      "attention_bias": false, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
      "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
      "weight_block_size": [128, 128]}})");
}

// DeepSeek-V3.2's: V3.1's (ue8m0 activation scales) with the lightning
// indexer's fields.
json PublishedV32() {
  json j = PublishedV3();
  j["architectures"] = {"DeepseekV32ForCausalLM"};
  j["model_type"] = "deepseek_v32";
  j["quantization_config"]["scale_fmt"] = "ue8m0";
  j["index_n_heads"] = 64;
  j["index_head_dim"] = 128;
  j["index_topk"] = 2048;
  return j;
}

// DeepSeek-V4-Flash's as released.
json ReleasedV4Flash() {
  json j = {
      {"architectures", {"DeepseekV4ForCausalLM"}},
      {"model_type", "deepseek_v4"},
      {"vocab_size", 129280},
      {"hidden_size", 4096},
      {"num_hidden_layers", 43},
      {"num_attention_heads", 64},
      {"num_key_value_heads", 1},
      {"head_dim", 512},
      {"qk_rope_head_dim", 64},
      {"q_lora_rank", 1024},
      {"o_groups", 8},
      {"o_lora_rank", 1024},
      {"n_routed_experts", 256},
      {"n_shared_experts", 1},
      {"num_experts_per_tok", 6},
      {"moe_intermediate_size", 2048},
      {"scoring_func", "sqrtsoftplus"},
      {"routed_scaling_factor", 1.5},
      {"swiglu_limit", 10.0},
      {"num_hash_layers", 3},
      {"sliding_window", 128},
      {"compress_rope_theta", 160000},
      {"rope_theta", 10000},
      {"rope_scaling",
       {{"type", "yarn"},
        {"factor", 16},
        {"original_max_position_embeddings", 65536},
        {"beta_fast", 32},
        {"beta_slow", 1}}},
      {"hc_mult", 4},
      {"hc_sinkhorn_iters", 20},
      {"hc_eps", 1e-6},
      {"index_n_heads", 64},
      {"index_head_dim", 128},
      {"index_topk", 512},
      {"num_nextn_predict_layers", 1},
      {"max_position_embeddings", 1048576},
      {"expert_dtype", "fp4"},
      {"quantization_config",
       {{"activation_scheme", "dynamic"},
        {"fmt", "e4m3"},
        {"quant_method", "fp8"},
        {"scale_fmt", "ue8m0"},
        {"weight_block_size", {128, 128}}}},
  };
  std::vector<int> ratios = {0, 0};
  for (int i = 0; i < 20; ++i) ratios.insert(ratios.end(), {4, 128});
  ratios.insert(ratios.end(), {4, 4});  // the last layer, then the MTP layer
  j["compress_ratios"] = ratios;
  return j;
}

// `config` with `patch` merged in (RFC 7386: a null erases its field).
json Patched(json config, const json& patch) {
  config.merge_patch(patch);
  return config;
}

void ExpectRefused(const json& config, absl::StatusCode code, const std::string& message) {
  const absl::Status s = ParseModelConfig(config.dump()).status();
  EXPECT_EQ(s.code(), code) << "wanted \"" << message << "\", got: " << s;
  EXPECT_NE(s.message().find(message), std::string::npos) << "wanted \"" << message << "\", got: " << s;
}

TEST(ModelConfig, V3FamilyConfigsAsPublished) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(PublishedV3().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, ModelType::kDeepseekV3);
  EXPECT_EQ(c->topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
  ASSERT_TRUE(c->fp8.has_value());
  EXPECT_EQ(c->fp8->block_rows, 128);
  const kernels::GateParams gate = c->Gate();
  EXPECT_TRUE(gate.noaux_tc && gate.group_limited && gate.norm_topk_prob);
  EXPECT_EQ(gate.n_group, 8u);
  EXPECT_EQ(gate.topk_group, 4u);
  EXPECT_FLOAT_EQ(gate.routed_scaling_factor, 2.5f);
  // YaRN's softmax scale from mscale_all_dim 1.0: (0.1 ln 40 + 1)^2, about
  // 1.874, not V2's 1.590.
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c->SoftmaxScale() * std::sqrt(192.0), m * m, 1e-12);
  EXPECT_NEAR(m * m, 1.874, 1e-3);
  // A 128 x 128-block scale of kv_a_proj_with_mqa: [576, 7168] -> [5, 56].
  EXPECT_EQ(ScaleSpec(LayerTensorsOf(*c, 0).kv_a, *c->fp8).shape, (std::vector<int64_t>{5, 56}));
  // V3.1's scale_fmt changes how DeepSeek's FP8 GEMMs round activation
  // scales, not the weights: accepted.
  EXPECT_TRUE(
      ParseModelConfig(Patched(PublishedV3(), {{"quantization_config", {{"scale_fmt", "ue8m0"}}}}).dump()).ok());
  // Kimi-K2: its own model_type on V3's architecture, no group limit.
  c = ParseModelConfig(
      Patched(PublishedV3(), {{"model_type", "kimi_k2"}, {"n_group", 1}, {"topk_group", 1}, {"n_routed_experts", 384}})
          .dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, ModelType::kKimiK2);
  EXPECT_FALSE(c->Gate().group_limited);
  EXPECT_TRUE(c->Gate().noaux_tc);
  // V3.2: the indexer's settings.
  c = ParseModelConfig(PublishedV32().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, ModelType::kDeepseekV32);
  ASSERT_TRUE(c->indexer.has_value());
  EXPECT_EQ(c->indexer->heads, 64);
  EXPECT_EQ(c->indexer->head_dim, 128);
  EXPECT_EQ(c->indexer->topk, 2048);
}

// V4-Flash's config.json as released parses; its MTP layer's ratio is
// dropped.
TEST(ModelConfig, V4FlashConfigAsReleased) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(ReleasedV4Flash().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->v4.has_value());
  EXPECT_EQ(c->v4->compress_ratios.size(), 43u);
  EXPECT_EQ(c->v4->max_ratio(), 128);
  EXPECT_EQ(c->indexer->topk, 512);
  EXPECT_EQ(c->v4->num_hash_layers, 3);
  EXPECT_TRUE(c->v4->fp4_experts);
  ASSERT_TRUE(c->fp8.has_value());
  EXPECT_EQ(c->fp8->block_cols, 128);
  EXPECT_EQ(ParseModelConfig(c->ToJson())->ToJson(), c->ToJson());
}

// The checks every family shares, on V3's config: sizes, numbers, flags,
// the names of the architecture and of the parts kvtier does not run.
TEST(ModelConfig, EachSharedCheckNamesItsField) {
  const auto refused = [](const json& patch, absl::StatusCode code, const std::string& message) {
    ExpectRefused(Patched(PublishedV3(), patch), code, message);
  };
  const absl::StatusCode invalid = absl::StatusCode::kInvalidArgument;
  refused({{"num_hidden_layers", 0}}, invalid, "num_hidden_layers must be an integer from 1 to 16777216");
  refused({{"num_nextn_predict_layers", -1}}, invalid, "num_nextn_predict_layers must be an integer from 0 to");
  refused({{"vocab_size", 1 << 25}}, invalid, "vocab_size must be an integer from 1 to 16777216");
  refused({{"hidden_size", 4096.5}}, invalid, "hidden_size must be an integer");
  refused({{"kv_lora_rank", nullptr}}, invalid, "kv_lora_rank must be present");
  refused({{"routed_scaling_factor", "2.5"}}, invalid, "routed_scaling_factor must be a finite number");
  refused({{"norm_topk_prob", 1}}, invalid, "norm_topk_prob must be true or false");
  refused({{"architectures", {"DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM"}}}, absl::StatusCode::kUnimplemented,
          "architectures [\"DeepseekV3ForCausalLM\",\"DeepseekV3ForCausalLM\"]");
  refused({{"attention_bias", true}}, absl::StatusCode::kUnimplemented, "attention_bias true is not supported");
  refused({{"qk_rope_head_dim", 63}}, invalid, "qk_rope_head_dim must be even");
  for (const double factor : {0.0, -40.0}) {
    refused({{"rope_scaling", {{"factor", factor}}}}, invalid, "rope_scaling.factor must be positive");
  }
  refused({{"quantization_config", {{"weight_block_size", {128, 0}}}}}, invalid,
          "quantization_config.weight_block_size must be two positive integers");
}

// The routed experts' settings, on V3's config (256 experts in 8 groups,
// 4 groups and 8 experts a token).
TEST(ModelConfig, EachRoutingCheckNamesItsField) {
  const auto refused = [](const json& patch, const std::string& message) {
    ExpectRefused(Patched(PublishedV3(), patch), absl::StatusCode::kInvalidArgument, message);
  };
  refused({{"num_experts_per_tok", 257}}, "num_experts_per_tok must be at most n_routed_experts");
  refused({{"topk_method", 3}}, "topk_method must be a string");
  refused({{"n_group", 7}}, "n_group must be a divisor of n_routed_experts");
  refused({{"topk_group", 9}}, "topk_group must be at most n_group");
  refused({{"num_experts_per_tok", 129}}, "num_experts_per_tok must be at most topk_group x experts per group");
  refused({{"n_group", 256}, {"topk_group", 8}}, "n_group must be at most n_routed_experts / 2");
  EXPECT_TRUE(ParseModelConfig(Patched(PublishedV3(), {{"num_experts_per_tok", 128}}).dump()).ok())
      << "4 groups of 32 hold 128 experts";
}

// V3.2's lightning indexer.
TEST(ModelConfig, EachIndexerCheckNamesItsField) {
  const auto refused = [](const json& patch, const std::string& message) {
    ExpectRefused(Patched(PublishedV32(), patch), absl::StatusCode::kInvalidArgument, message);
  };
  refused({{"q_lora_rank", nullptr}}, "q_lora_rank must be present (the indexer's queries start from it)");
  refused({{"index_head_dim", 96}}, "index_head_dim must be a power of two, at least qk_rope_head_dim");
  refused({{"index_head_dim", 32}}, "index_head_dim must be a power of two, at least qk_rope_head_dim");
  refused({{"index_topk", nullptr}}, "index_topk must be present");
}

// DeepSeek-V4's own fields, on V4-Flash's config.
TEST(ModelConfig, EachV4CheckNamesItsField) {
  const auto refused = [](const json& patch, absl::StatusCode code, const std::string& message) {
    ExpectRefused(Patched(ReleasedV4Flash(), patch), code, message);
  };
  const absl::StatusCode invalid = absl::StatusCode::kInvalidArgument;
  const absl::StatusCode unimplemented = absl::StatusCode::kUnimplemented;
  refused({{"num_key_value_heads", 2}}, invalid, "num_key_value_heads must be 1");
  refused({{"scoring_func", "sigmoid"}}, unimplemented, "scoring_func \"sigmoid\" is not supported");
  refused({{"expert_dtype", "fp8"}}, unimplemented, "expert_dtype \"fp8\" is not supported (only \"fp4\")");
  refused({{"quantization_config", nullptr}}, invalid, "expert_dtype must be absent without quantization_config");
  refused({{"o_groups", 7}}, invalid, "o_groups must be a divisor of num_attention_heads");
  refused({{"n_shared_experts", 2}}, invalid, "n_shared_experts must be 1");
  refused({{"num_experts_per_tok", 257}}, invalid, "num_experts_per_tok must be at most n_routed_experts");
  refused({{"swiglu_limit", -1.0}}, invalid, "swiglu_limit must be 0 (none) or positive");
  refused({{"num_hash_layers", 44}}, invalid, "num_hash_layers must be at most num_hidden_layers");
  refused({{"hc_eps", -1e-6}}, invalid, "hc_eps must be at least 0");
  refused({{"compress_ratios", {0, 4}}}, invalid, "compress_ratios must be a list with one entry per layer");
  // The latent's rope and non-rope parts: an even rope part, the rest a
  // positive multiple of 64.
  const std::string rope = "qk_rope_head_dim must be even, with head_dim - qk_rope_head_dim a positive multiple of 64";
  refused({{"head_dim", 500}}, invalid, rope);
  refused({{"head_dim", 64}}, invalid, rope);
  refused({{"head_dim", 127}, {"qk_rope_head_dim", 63}}, invalid, rope);
  // A rope part of 16 lets a 16-wide indexer key be a power of two, but
  // not whole FP4 blocks of 32.
  refused({{"head_dim", 80}, {"qk_rope_head_dim", 16}, {"index_head_dim", 16}}, invalid,
          "index_head_dim must be a multiple of 32 (its FP4 blocks)");

  for (const int ratio : {1, -4}) {
    json ratios = ReleasedV4Flash();
    ratios["compress_ratios"][5] = ratio;
    ExpectRefused(ratios, invalid, "compress_ratios[5] must be 0 or a ratio of at least 2");
  }
  refused({{"quantization_config", {{"scale_fmt", nullptr}}}}, unimplemented,
          "quantization_config.scale_fmt (missing) is not supported");
  // expert_dtype may also sit in quantization_config.
  refused({{"expert_dtype", nullptr}, {"quantization_config", {{"expert_dtype", "fp8"}}}}, unimplemented,
          "expert_dtype \"fp8\" is not supported (only \"fp4\")");
}

TEST(ModelConfig, SoftmaxScaleIncludesYarnMscaleSquared) {
  ModelConfig c = *PresetConfig("lite-attn");
  const double mscale = 0.1 * 0.707 * std::log(40.0) + 1.0;  // DeepSeek's yarn_get_mscale
  EXPECT_NEAR(c.SoftmaxScale(), mscale * mscale / std::sqrt(192.0), 1e-12);
  c.rope_scaling.reset();
  EXPECT_NEAR(c.SoftmaxScale(), 1.0 / std::sqrt(192.0), 1e-15);
}

TEST(ModelConfig, MoeLayersFollowFirstKDenseAndFrequency) {
  ModelConfig c = *PresetConfig("tiny");
  c.num_hidden_layers = 6;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 2;
  std::vector<bool> moe;
  for (int i = 0; i < 6; ++i) moe.push_back(c.IsMoeLayer(i));
  EXPECT_EQ(moe, (std::vector<bool>{false, false, true, false, true, false}));
  c.n_routed_experts = 0;
  EXPECT_FALSE(c.IsMoeLayer(2)) << "no experts: every layer dense";
}

TEST(ModelConfig, JsonRoundTrip) {
  for (const char* preset : {"tiny", "lite-attn", "v3-tiny", "kimi-k2-tiny", "v32-tiny", "v4-tiny"}) {
    const ModelConfig c = *PresetConfig(preset);
    absl::StatusOr<ModelConfig> back = ParseModelConfig(c.ToJson());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->ToJson(), c.ToJson()) << preset;
  }
  EXPECT_EQ(PresetConfig("huge").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::runtime
