#include "services/runtime/model_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "services/base/status.h"

namespace kvtier::runtime {
namespace {

using nlohmann::json;

absl::Status Missing(const std::string& field, const std::string& want) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", field, " must be ", want));
}

// Every size in config.json is at most this: far above any real model's
// (DeepSeek-V3's largest, the vocabulary, is 129,280), and low enough that
// the products of two of them that name tensor shapes fit in 64 bits.
constexpr int64_t kMaxConfigInt = int64_t{1} << 24;

// An integer field in [min, kMaxConfigInt]; `fallback` when absent or null
// (if given).
absl::StatusOr<int64_t> Int(const json& j, const std::string& field, std::optional<int64_t> fallback = std::nullopt,
                            int64_t min = 1) {
  if (!j.contains(field) || j[field].is_null()) {
    if (fallback.has_value()) return *fallback;
    return Missing(field, "present");
  }
  if (!j[field].is_number_integer() || j[field].get<int64_t>() < min || j[field].get<int64_t>() > kMaxConfigInt) {
    return Missing(field, absl::StrCat("an integer from ", min, " to ", kMaxConfigInt));
  }
  return j[field].get<int64_t>();
}

absl::StatusOr<double> Real(const json& j, const std::string& field, std::optional<double> fallback) {
  if (!j.contains(field) || j[field].is_null()) {
    if (fallback.has_value()) return *fallback;
    return Missing(field, "present");
  }
  if (!j[field].is_number() || !std::isfinite(j[field].get<double>())) {
    return Missing(field, "a finite number");
  }
  return j[field].get<double>();
}

absl::StatusOr<bool> Bool(const json& j, const std::string& field, bool fallback) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  if (!j[field].is_boolean()) return Missing(field, "true or false");
  return j[field].get<bool>();
}

// A string field that must be one of `supported` when present.
absl::Status Expect(const json& j, const std::string& field, const std::string& supported) {
  if (!j.contains(field) || j[field].is_null()) return absl::OkStatus();
  if (!j[field].is_string() || j[field].get<std::string>() != supported) {
    return absl::UnimplementedError(
        absl::StrCat("config.json: ", field, " ", j[field].dump(), " is not supported (only \"", supported, "\")"));
  }
  return absl::OkStatus();
}

double YarnMscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// config.json's architectures entry for a model type.
std::string ArchitectureOf(ModelType type) {
  switch (type) {
    case ModelType::kDeepseekV2:
      return "DeepseekV2ForCausalLM";
    case ModelType::kDeepseekV32:
      return "DeepseekV32ForCausalLM";
    case ModelType::kDeepseekV4:
      return "DeepseekV4ForCausalLM";
    default:
      return "DeepseekV3ForCausalLM";
  }
}

// model_type and architectures as published: V2's, or the V3 family's.
absl::StatusOr<ModelType> ParseModelType(const json& j) {
  const std::string type =
      j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : std::string();
  ModelType model_type;
  if (type == "deepseek_v2") {
    model_type = ModelType::kDeepseekV2;
  } else if (type == "deepseek_v3") {
    model_type = ModelType::kDeepseekV3;
  } else if (type == "kimi_k2") {
    model_type = ModelType::kKimiK2;
  } else if (type == "deepseek_v32") {
    model_type = ModelType::kDeepseekV32;
  } else if (type == "deepseek_v4") {
    model_type = ModelType::kDeepseekV4;
  } else {
    return absl::UnimplementedError(
        absl::StrCat("config.json: model_type ", j.contains("model_type") ? j["model_type"].dump() : "(missing)",
                     " is not supported (deepseek_v2, deepseek_v3, kimi_k2, deepseek_v32, deepseek_v4)"));
  }
  const std::string architecture = ArchitectureOf(model_type);
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    const json& a = j["architectures"];
    if (!a.is_array() || a.size() != 1 || a[0] != architecture) {
      return absl::UnimplementedError(absl::StrCat("config.json: architectures ", a.dump(), " is not supported for ",
                                                   type, " (only [\"", architecture, "\"])"));
    }
  }
  return model_type;
}

// quantization_config: absent, or DeepSeek-V3's block-scaled FP8.
absl::StatusOr<std::optional<Fp8Quantization>> ParseQuantization(const json& j) {
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return std::nullopt;
  const json& q = j["quantization_config"];
  if (!q.is_object()) return Missing("quantization_config", "an object or null");
  const std::string method = q.contains("quant_method") ? q["quant_method"].dump() : "(missing)";
  if (method != "\"fp8\"") {
    return absl::UnimplementedError(
        absl::StrCat("config.json: quantization_config.quant_method ", method, " is not supported (only \"fp8\")"));
  }
  KVTIER_RETURN_IF_ERROR(Expect(q, "fmt", "e4m3"));
  // Activations are quantized by DeepSeek's own FP8 GEMMs only (dynamic
  // per-token scales, ue8m0 in V3.1); kvtier's products take float inputs.
  KVTIER_RETURN_IF_ERROR(Expect(q, "activation_scheme", "dynamic"));
  Fp8Quantization fp8;
  if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
    const json& b = q["weight_block_size"];
    if (!b.is_array() || b.size() != 2) return Missing("quantization_config.weight_block_size", "[rows, cols]");
    for (const json& n : b) {
      if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > kMaxConfigInt) {
        return Missing("quantization_config.weight_block_size", "two positive integers");
      }
    }
    fp8.block_rows = b[0].get<int64_t>();
    fp8.block_cols = b[1].get<int64_t>();
  }
  return fp8;
}

// rope_scaling: absent, or YaRN.
absl::StatusOr<std::optional<kernels::YarnParams>> ParseRopeScaling(const json& j) {
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return std::nullopt;
  const json& r = j["rope_scaling"];
  if (!r.is_object()) return Missing("rope_scaling", "an object or null");
  const std::string type = r.value("type", r.value("rope_type", std::string()));
  if (type != "yarn") {
    return absl::UnimplementedError(
        absl::StrCat("config.json: rope_scaling type \"", type, "\" is not supported (only \"yarn\")"));
  }
  kernels::YarnParams y;
  KVTIER_ASSIGN_OR_RETURN(y.factor, Real(r, "factor", std::nullopt));
  KVTIER_ASSIGN_OR_RETURN(y.original_max_position_embeddings, Int(r, "original_max_position_embeddings", 4096));
  KVTIER_ASSIGN_OR_RETURN(y.beta_fast, Real(r, "beta_fast", 32.0));
  KVTIER_ASSIGN_OR_RETURN(y.beta_slow, Real(r, "beta_slow", 1.0));
  KVTIER_ASSIGN_OR_RETURN(y.mscale, Real(r, "mscale", 1.0));
  KVTIER_ASSIGN_OR_RETURN(y.mscale_all_dim, Real(r, "mscale_all_dim", 0.0));
  if (y.factor <= 0) return Missing("rope_scaling.factor", "positive");
  return y;
}

// The index_* fields of V3.2's and V4's lightning indexer.
absl::StatusOr<IndexerConfig> ParseIndexer(const json& j, int64_t rope_dim) {
  IndexerConfig indexer;
  KVTIER_ASSIGN_OR_RETURN(indexer.heads, Int(j, "index_n_heads"));
  KVTIER_ASSIGN_OR_RETURN(indexer.head_dim, Int(j, "index_head_dim"));
  KVTIER_ASSIGN_OR_RETURN(indexer.topk, Int(j, "index_topk"));
  if ((indexer.head_dim & (indexer.head_dim - 1)) != 0 || indexer.head_dim < rope_dim) {
    return Missing("index_head_dim", "a power of two, at least qk_rope_head_dim");
  }
  return indexer;
}

// DeepSeek-V4's config.json as released (V4-Flash, V4-Pro).
absl::StatusOr<ModelConfig> ParseV4Config(const json& j) {
  KVTIER_RETURN_IF_ERROR(Expect(j, "hidden_act", "silu"));
  KVTIER_RETURN_IF_ERROR(Expect(j, "scoring_func", "sqrtsoftplus"));
  ModelConfig c;
  c.model_type = ModelType::kDeepseekV4;
  V4Config& v4 = c.v4.emplace();
  // As released: FP8 projections with E8M0 block scales whose products
  // round their inputs to FP8 with power-of-two scales ("ue8m0"), and
  // MXFP4 routed experts (expert_dtype, at the top or in the quantization).
  KVTIER_ASSIGN_OR_RETURN(c.fp8, ParseQuantization(j));
  if (c.fp8.has_value()) {
    const json& q = j["quantization_config"];
    if (!q.contains("scale_fmt") || q["scale_fmt"] != "ue8m0") {
      return absl::UnimplementedError(absl::StrCat("config.json: quantization_config.scale_fmt ",
                                                   q.contains("scale_fmt") ? q["scale_fmt"].dump() : "(missing)",
                                                   " is not supported for deepseek_v4 (only \"ue8m0\")"));
    }
    KVTIER_RETURN_IF_ERROR(Expect(q, "expert_dtype", "fp4"));
    v4.fp4_experts = q.contains("expert_dtype") && !q["expert_dtype"].is_null();
  }
  KVTIER_RETURN_IF_ERROR(Expect(j, "expert_dtype", "fp4"));
  v4.fp4_experts |= j.contains("expert_dtype") && !j["expert_dtype"].is_null();
  if (v4.fp4_experts && !c.fp8.has_value()) {
    return Missing("expert_dtype", "absent without quantization_config (FP4 experts come with FP8 projections)");
  }
  KVTIER_ASSIGN_OR_RETURN(c.num_nextn_predict_layers, Int(j, "num_nextn_predict_layers", 0, 0));
  KVTIER_ASSIGN_OR_RETURN(c.vocab_size, Int(j, "vocab_size"));
  KVTIER_ASSIGN_OR_RETURN(c.hidden_size, Int(j, "hidden_size"));
  KVTIER_ASSIGN_OR_RETURN(c.num_hidden_layers, Int(j, "num_hidden_layers"));
  KVTIER_ASSIGN_OR_RETURN(c.num_attention_heads, Int(j, "num_attention_heads"));
  KVTIER_ASSIGN_OR_RETURN(const int64_t kv_heads, Int(j, "num_key_value_heads", 1));
  if (kv_heads != 1) return Missing("num_key_value_heads", "1 (DeepSeek-V4 shares one key-value head)");
  KVTIER_ASSIGN_OR_RETURN(c.q_lora_rank, Int(j, "q_lora_rank"));
  KVTIER_ASSIGN_OR_RETURN(v4.head_dim, Int(j, "head_dim"));
  KVTIER_ASSIGN_OR_RETURN(c.qk_rope_head_dim, Int(j, "qk_rope_head_dim"));
  if (c.qk_rope_head_dim % 2 != 0 || c.qk_rope_head_dim >= v4.head_dim || (v4.head_dim - c.qk_rope_head_dim) % 64) {
    return Missing("qk_rope_head_dim", "even, with head_dim - qk_rope_head_dim a positive multiple of 64");
  }
  KVTIER_ASSIGN_OR_RETURN(v4.o_groups, Int(j, "o_groups"));
  KVTIER_ASSIGN_OR_RETURN(v4.o_lora_rank, Int(j, "o_lora_rank"));
  if (c.num_attention_heads % v4.o_groups != 0) return Missing("o_groups", "a divisor of num_attention_heads");
  KVTIER_ASSIGN_OR_RETURN(c.n_routed_experts, Int(j, "n_routed_experts"));
  KVTIER_ASSIGN_OR_RETURN(c.n_shared_experts, Int(j, "n_shared_experts", 1));
  if (c.n_shared_experts != 1) return Missing("n_shared_experts", "1 (as DeepSeek-V4's MoE has)");
  KVTIER_ASSIGN_OR_RETURN(c.num_experts_per_tok, Int(j, "num_experts_per_tok"));
  if (c.num_experts_per_tok > c.n_routed_experts) return Missing("num_experts_per_tok", "at most n_routed_experts");
  KVTIER_ASSIGN_OR_RETURN(c.moe_intermediate_size, Int(j, "moe_intermediate_size"));
  KVTIER_ASSIGN_OR_RETURN(c.routed_scaling_factor, Real(j, "routed_scaling_factor", 1.0));
  KVTIER_ASSIGN_OR_RETURN(v4.swiglu_limit, Real(j, "swiglu_limit", 0.0));
  if (v4.swiglu_limit < 0) return Missing("swiglu_limit", "0 (none) or positive");
  KVTIER_ASSIGN_OR_RETURN(v4.num_hash_layers, Int(j, "num_hash_layers", 0, 0));
  if (v4.num_hash_layers > c.num_hidden_layers) return Missing("num_hash_layers", "at most num_hidden_layers");
  KVTIER_ASSIGN_OR_RETURN(c.rms_norm_eps, Real(j, "rms_norm_eps", 1e-6));
  KVTIER_ASSIGN_OR_RETURN(c.rope_theta, Real(j, "rope_theta", 10000.0));
  KVTIER_ASSIGN_OR_RETURN(v4.compress_rope_theta, Real(j, "compress_rope_theta", 160000.0));
  KVTIER_ASSIGN_OR_RETURN(c.max_position_embeddings, Int(j, "max_position_embeddings", 4096));
  KVTIER_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j));
  KVTIER_ASSIGN_OR_RETURN(v4.sliding_window, Int(j, "sliding_window"));
  KVTIER_ASSIGN_OR_RETURN(v4.hc_mult, Int(j, "hc_mult", 4));
  KVTIER_ASSIGN_OR_RETURN(v4.hc_sinkhorn_iters, Int(j, "hc_sinkhorn_iters", 20));
  KVTIER_ASSIGN_OR_RETURN(v4.hc_eps, Real(j, "hc_eps", 1e-6));
  if (v4.hc_eps < 0) return Missing("hc_eps", "at least 0");
  // One ratio a layer, then the MTP layers' (which kvtier does not run).
  const int64_t layers = c.num_hidden_layers;
  if (!j.contains("compress_ratios") || !j["compress_ratios"].is_array() ||
      static_cast<int64_t>(j["compress_ratios"].size()) < layers) {
    return Missing("compress_ratios", "a list with one entry per layer (0, 4, or another ratio of at least 2)");
  }
  bool csa = false;
  for (int64_t i = 0; i < layers; ++i) {
    const json& r = j["compress_ratios"][static_cast<size_t>(i)];
    if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() == 1 || r.get<int64_t>() > kMaxConfigInt) {
      return Missing(absl::StrCat("compress_ratios[", i, "]"), "0 or a ratio of at least 2");
    }
    v4.compress_ratios.push_back(r.get<int64_t>());
    csa |= r.get<int64_t>() == 4;
  }
  if (csa) {
    KVTIER_ASSIGN_OR_RETURN(c.indexer, ParseIndexer(j, c.qk_rope_head_dim));
    if (c.indexer->head_dim % 32 != 0) return Missing("index_head_dim", "a multiple of 32 (its FP4 blocks)");
  }
  return c;
}

}  // namespace

int64_t V4Config::max_ratio() const {
  int64_t most = 1;
  for (int64_t r : compress_ratios) most = std::max(most, r);
  return most;
}

const char* ModelTypeName(ModelType type) {
  switch (type) {
    case ModelType::kDeepseekV2:
      return "deepseek_v2";
    case ModelType::kDeepseekV3:
      return "deepseek_v3";
    case ModelType::kKimiK2:
      return "kimi_k2";
    case ModelType::kDeepseekV32:
      return "deepseek_v32";
    case ModelType::kDeepseekV4:
      return "deepseek_v4";
  }
  return "?";
}

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
}

kernels::GateParams ModelConfig::Gate() const {
  kernels::GateParams gate;
  gate.top_k = static_cast<uint32_t>(num_experts_per_tok);
  gate.noaux_tc = topk_method == TopkMethod::kNoauxTc;
  gate.group_limited = topk_method == TopkMethod::kGroupLimitedGreedy || (gate.noaux_tc && n_group > 1);
  gate.n_group = static_cast<uint32_t>(n_group);
  gate.topk_group = static_cast<uint32_t>(topk_group);
  gate.norm_topk_prob = norm_topk_prob;
  gate.routed_scaling_factor = static_cast<float>(routed_scaling_factor);
  return gate;
}

double ModelConfig::SoftmaxScale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(q_head_dim()));
  if (rope_scaling.has_value() && rope_scaling->mscale_all_dim != 0.0) {
    const double m = YarnMscale(rope_scaling->factor, rope_scaling->mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("config.json is not a JSON object");
  KVTIER_ASSIGN_OR_RETURN(const ModelType model_type, ParseModelType(j));
  if (model_type == ModelType::kDeepseekV4) return ParseV4Config(j);
  const bool v3 = model_type != ModelType::kDeepseekV2;
  KVTIER_RETURN_IF_ERROR(Expect(j, "hidden_act", "silu"));
  KVTIER_RETURN_IF_ERROR(Expect(j, "scoring_func", v3 ? "sigmoid" : "softmax"));
  KVTIER_ASSIGN_OR_RETURN(bool attention_bias, Bool(j, "attention_bias", false));
  if (attention_bias) return absl::UnimplementedError("config.json: attention_bias true is not supported");

  ModelConfig c;
  c.model_type = model_type;
  KVTIER_ASSIGN_OR_RETURN(c.fp8, ParseQuantization(j));
  KVTIER_ASSIGN_OR_RETURN(c.num_nextn_predict_layers, Int(j, "num_nextn_predict_layers", 0, 0));
  KVTIER_ASSIGN_OR_RETURN(c.vocab_size, Int(j, "vocab_size"));
  KVTIER_ASSIGN_OR_RETURN(c.hidden_size, Int(j, "hidden_size"));
  KVTIER_ASSIGN_OR_RETURN(c.intermediate_size, Int(j, "intermediate_size"));
  KVTIER_ASSIGN_OR_RETURN(c.num_hidden_layers, Int(j, "num_hidden_layers"));
  KVTIER_ASSIGN_OR_RETURN(c.num_attention_heads, Int(j, "num_attention_heads"));
  if (j.contains("q_lora_rank") && !j["q_lora_rank"].is_null()) {
    KVTIER_ASSIGN_OR_RETURN(c.q_lora_rank, Int(j, "q_lora_rank"));
  }
  KVTIER_ASSIGN_OR_RETURN(c.kv_lora_rank, Int(j, "kv_lora_rank"));
  KVTIER_ASSIGN_OR_RETURN(c.qk_nope_head_dim, Int(j, "qk_nope_head_dim"));
  KVTIER_ASSIGN_OR_RETURN(c.qk_rope_head_dim, Int(j, "qk_rope_head_dim"));
  if (c.qk_rope_head_dim % 2 != 0) return Missing("qk_rope_head_dim", "even");
  KVTIER_ASSIGN_OR_RETURN(c.v_head_dim, Int(j, "v_head_dim"));
  KVTIER_ASSIGN_OR_RETURN(c.n_routed_experts, Int(j, "n_routed_experts", 0, 0));
  KVTIER_ASSIGN_OR_RETURN(c.n_shared_experts, Int(j, "n_shared_experts", 0, 0));
  KVTIER_ASSIGN_OR_RETURN(c.first_k_dense_replace, Int(j, "first_k_dense_replace", 0, 0));
  KVTIER_ASSIGN_OR_RETURN(c.moe_layer_freq, Int(j, "moe_layer_freq", 1));
  KVTIER_ASSIGN_OR_RETURN(c.norm_topk_prob, Bool(j, "norm_topk_prob", false));
  KVTIER_ASSIGN_OR_RETURN(c.routed_scaling_factor, Real(j, "routed_scaling_factor", 1.0));
  KVTIER_ASSIGN_OR_RETURN(c.rms_norm_eps, Real(j, "rms_norm_eps", 1e-6));
  KVTIER_ASSIGN_OR_RETURN(c.rope_theta, Real(j, "rope_theta", 10000.0));
  KVTIER_ASSIGN_OR_RETURN(c.max_position_embeddings, Int(j, "max_position_embeddings", 4096));
  if (c.n_routed_experts > 0) {
    KVTIER_ASSIGN_OR_RETURN(c.moe_intermediate_size, Int(j, "moe_intermediate_size"));
    KVTIER_ASSIGN_OR_RETURN(c.num_experts_per_tok, Int(j, "num_experts_per_tok"));
    if (c.num_experts_per_tok > c.n_routed_experts) {
      return Missing("num_experts_per_tok", "at most n_routed_experts");
    }
    if (j.contains("topk_method") && !j["topk_method"].is_null() && !j["topk_method"].is_string()) {
      return Missing("topk_method", "a string");
    }
    // V2 defaults to greedy; the V3 family knows only noaux_tc.
    const std::string method = j.contains("topk_method") && j["topk_method"].is_string()
                                   ? j["topk_method"].get<std::string>()
                                   : std::string(v3 ? "noaux_tc" : "greedy");
    if (!v3 && method == "greedy") {
      c.topk_method = TopkMethod::kGreedy;
    } else if (!v3 && method == "group_limited_greedy") {
      c.topk_method = TopkMethod::kGroupLimitedGreedy;
    } else if (v3 && method == "noaux_tc") {
      c.topk_method = TopkMethod::kNoauxTc;
    } else {
      return absl::UnimplementedError(absl::StrCat("config.json: topk_method \"", method, "\" is not supported for ",
                                                   ModelTypeName(model_type), " (",
                                                   v3 ? "noaux_tc" : "greedy, group_limited_greedy", ")"));
    }
    if (c.topk_method != TopkMethod::kGreedy) {
      KVTIER_ASSIGN_OR_RETURN(c.n_group, Int(j, "n_group", v3 ? std::optional<int64_t>(1) : std::nullopt));
      KVTIER_ASSIGN_OR_RETURN(c.topk_group, Int(j, "topk_group", v3 ? std::optional<int64_t>(1) : std::nullopt));
      if (c.n_routed_experts % c.n_group != 0) return Missing("n_group", "a divisor of n_routed_experts");
      if (c.topk_group > c.n_group) return Missing("topk_group", "at most n_group");
      if (c.num_experts_per_tok > c.topk_group * (c.n_routed_experts / c.n_group)) {
        return Missing("num_experts_per_tok", "at most topk_group x experts per group");
      }
      // noaux_tc ranks a group by its two best experts.
      if (v3 && c.n_group > 1 && c.n_routed_experts / c.n_group < 2) {
        return Missing("n_group", "at most n_routed_experts / 2 (noaux_tc ranks groups by their two best experts)");
      }
    }
  }
  KVTIER_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j));
  if (model_type == ModelType::kDeepseekV32) {
    KVTIER_ASSIGN_OR_RETURN(c.indexer, ParseIndexer(j, c.qk_rope_head_dim));
    if (!c.q_lora_rank.has_value()) return Missing("q_lora_rank", "present (the indexer's queries start from it)");
  }
  return c;
}

namespace {

// rope_scaling as config.json spells it.
json YarnJson(const kernels::YarnParams& y) {
  return {{"type", "yarn"},
          {"factor", y.factor},
          {"original_max_position_embeddings", y.original_max_position_embeddings},
          {"beta_fast", y.beta_fast},
          {"beta_slow", y.beta_slow},
          {"mscale", y.mscale},
          {"mscale_all_dim", y.mscale_all_dim}};
}

// The indexer's fields and quantization_config, when the config has them
// (V4's FP8 says its power-of-two activation scales: scale_fmt ue8m0).
void AddIndexerAndQuantization(const ModelConfig& c, json& j) {
  if (c.indexer.has_value()) {
    j["index_n_heads"] = c.indexer->heads;
    j["index_head_dim"] = c.indexer->head_dim;
    j["index_topk"] = c.indexer->topk;
  }
  if (c.fp8.has_value()) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"weight_block_size", {c.fp8->block_rows, c.fp8->block_cols}}};
    if (c.v4.has_value()) j["quantization_config"]["scale_fmt"] = "ue8m0";
  }
}

// DeepSeek-V4's fields, as its released config.json names them.
json V4Json(const ModelConfig& c) {
  const V4Config& v4 = *c.v4;
  json j = {
      {"model_type", ModelTypeName(c.model_type)},
      {"architectures", {ArchitectureOf(c.model_type)}},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", 1},
      {"head_dim", v4.head_dim},
      {"qk_rope_head_dim", c.qk_rope_head_dim},
      {"q_lora_rank", *c.q_lora_rank},
      {"o_groups", v4.o_groups},
      {"o_lora_rank", v4.o_lora_rank},
      {"n_routed_experts", c.n_routed_experts},
      {"n_shared_experts", c.n_shared_experts},
      {"num_experts_per_tok", c.num_experts_per_tok},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"scoring_func", "sqrtsoftplus"},
      {"routed_scaling_factor", c.routed_scaling_factor},
      {"swiglu_limit", v4.swiglu_limit},
      {"num_hash_layers", v4.num_hash_layers},
      {"sliding_window", v4.sliding_window},
      {"compress_ratios", v4.compress_ratios},
      {"compress_rope_theta", v4.compress_rope_theta},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", c.rope_scaling.has_value() ? YarnJson(*c.rope_scaling) : json(nullptr)},
      {"hc_mult", v4.hc_mult},
      {"hc_sinkhorn_iters", v4.hc_sinkhorn_iters},
      {"hc_eps", v4.hc_eps},
      {"rms_norm_eps", c.rms_norm_eps},
      {"max_position_embeddings", c.max_position_embeddings},
      {"num_nextn_predict_layers", c.num_nextn_predict_layers},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
  };
  // The MTP layers' entries follow the layers' (as released: a CSA layer).
  for (int64_t i = 0; i < c.num_nextn_predict_layers; ++i) j["compress_ratios"].push_back(4);
  AddIndexerAndQuantization(c, j);
  if (v4.fp4_experts) j["expert_dtype"] = "fp4";
  return j;
}

}  // namespace

std::string ModelConfig::ToJson() const {
  if (v4.has_value()) return V4Json(*this).dump(2);
  const bool v3 = model_type != ModelType::kDeepseekV2;
  const char* method = topk_method == TopkMethod::kGreedy               ? "greedy"
                       : topk_method == TopkMethod::kGroupLimitedGreedy ? "group_limited_greedy"
                                                                        : "noaux_tc";
  json j = {
      {"model_type", ModelTypeName(model_type)},
      {"architectures", {ArchitectureOf(model_type)}},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"moe_intermediate_size", moe_intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_attention_heads},
      {"q_lora_rank", q_lora_rank.has_value() ? json(*q_lora_rank) : json(nullptr)},
      {"kv_lora_rank", kv_lora_rank},
      {"qk_nope_head_dim", qk_nope_head_dim},
      {"qk_rope_head_dim", qk_rope_head_dim},
      {"v_head_dim", v_head_dim},
      {"n_routed_experts", n_routed_experts},
      {"n_shared_experts", n_shared_experts},
      {"num_experts_per_tok", num_experts_per_tok},
      {"topk_method", method},
      {"n_group", n_group},
      {"topk_group", topk_group},
      {"norm_topk_prob", norm_topk_prob},
      {"routed_scaling_factor", routed_scaling_factor},
      {"first_k_dense_replace", first_k_dense_replace},
      {"moe_layer_freq", moe_layer_freq},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"max_position_embeddings", max_position_embeddings},
      {"hidden_act", "silu"},
      {"scoring_func", v3 ? "sigmoid" : "softmax"},
      {"attention_bias", false},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
  };
  j["rope_scaling"] = rope_scaling.has_value() ? YarnJson(*rope_scaling) : json(nullptr);
  if (v3) j["num_nextn_predict_layers"] = num_nextn_predict_layers;
  AddIndexerAndQuantization(*this, j);
  return j.dump(2);
}

}  // namespace kvtier::runtime
