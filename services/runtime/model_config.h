// The configuration of a DeepSeek-style MLA model, read from a Hugging Face
// config.json: DeepSeek-V2 (model_type "deepseek_v2") and the V3 family
// (DeepSeek-V3, R1, V3.1: "deepseek_v3"; Kimi-K2: "kimi_k2"; DeepSeek-V3.2
// with its sparse attention: "deepseek_v32") and DeepSeek-V4
// ("deepseek_v4": windowed and compressed attention, V4Config). The tensors
// such a checkpoint holds are model_tensors.h's (V4's: v4_tensors.h).
#ifndef KVTIER_SERVICES_RUNTIME_MODEL_CONFIG_H_
#define KVTIER_SERVICES_RUNTIME_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/rope.h"

namespace kvtier::runtime {

// config.json's model_type. The V3 family shares V3's architecture: V2's
// attention and cache, a sigmoid router; V3.2 adds a lightning indexer
// that picks the tokens each query attends to (IndexerConfig). V4 is a
// different architecture (V4Config).
enum class ModelType { kDeepseekV2, kDeepseekV3, kKimiK2, kDeepseekV32, kDeepseekV4 };
const char* ModelTypeName(ModelType type);  // as config.json spells it

// greedy and group_limited_greedy: V2's softmax router; noaux_tc: V3's
// sigmoid router with a score correction bias (kernels::GateParams).
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };

// quantization_config {"quant_method": "fp8", "fmt": "e4m3",
// "weight_block_size": [rows, cols]}: every projection stored as FP8 E4M3
// with a float32 scale per block of rows x cols (dequantized by
// multiplying), as DeepSeek-V3 publishes its weights.
struct Fp8Quantization {
  int64_t block_rows = 128;
  int64_t block_cols = 128;
};

// DeepSeek-V3.2's lightning indexer (kernels/indexer.h): `heads` heads of
// `head_dim` (a power of two, one FP8 scale a head and a key) score every
// earlier token; MLA attends to the `topk` best.
struct IndexerConfig {
  int64_t heads = 64;
  int64_t head_dim = 128;
  int64_t topk = 2048;
};

// DeepSeek-V4 (DeepSeek's V4-Flash inference/model.py): one shared
// key-value head of head_dim (K = V, the last qk_rope_head_dim dims
// rotated), attending over a sliding window of the last `sliding_window`
// tokens' entries plus, per layer by compress_ratios, compressed entries
// (0: none; 4: one per 4 tokens from overlapping groups, chosen by the
// indexer, IndexerConfig; other ratios: one per `ratio` tokens, all
// attended). Compressed layers rotate with compress_rope_theta and YaRN,
// window-only layers with rope_theta and none. A per-head attention sink,
// a grouped output projection, hc_mult residual copies mixed by Sinkhorn
// (hyper-connections), MoE with sqrt(softplus) scores (num_hash_layers
// first layers route by token id) and a clamped SwiGLU (swiglu_limit).
struct V4Config {
  int64_t head_dim = 512;
  int64_t sliding_window = 128;
  std::vector<int64_t> compress_ratios;  // one per layer (MTP layers' entries dropped)
  double compress_rope_theta = 160000.0;
  int64_t o_groups = 8;
  int64_t o_lora_rank = 1024;
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  int64_t num_hash_layers = 0;
  double swiglu_limit = 0.0;  // 0: no clamp
  // expert_dtype "fp4": routed experts in MXFP4 (the projections in FP8
  // with E8M0 block scales, ModelConfig::fp8, as V4 is released).
  bool fp4_experts = false;

  int64_t max_ratio() const;
};

// Plain value type.
struct ModelConfig {
  ModelType model_type = ModelType::kDeepseekV2;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP layers
  int64_t moe_intermediate_size = 0;  // each routed and shared expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  std::optional<int64_t> q_lora_rank;  // absent: a plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_routed_experts = 0;  // 0: every layer dense
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  TopkMethod topk_method = TopkMethod::kGreedy;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 4096;
  std::optional<kernels::YarnParams> rope_scaling;
  std::optional<Fp8Quantization> fp8;    // absent: projections in bf16 (or f16/f32)
  std::optional<IndexerConfig> indexer;  // V3.2's sparse attention; V4's CSA layers
  std::optional<V4Config> v4;            // set exactly for kDeepseekV4
  // Multi-token prediction layers stored after the last layer (V3: 1); a
  // server that does not decode speculatively skips them.
  int64_t num_nextn_predict_layers = 0;

  int64_t q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Layers from first_k_dense_replace on, every moe_layer_freq-th, are MoE.
  bool IsMoeLayer(int64_t layer) const;
  // How the MoE layers' gate picks and weighs experts (a noaux_tc layer's
  // correction bias is its own: the caller sets it).
  kernels::GateParams Gate() const;
  // q_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN, as
  // DeepSeek-V2's modeling code computes it.
  double SoftmaxScale() const;

  // The fields as config.json spells them (what make-model writes).
  std::string ToJson() const;
};

// Parses and checks config.json text. INVALID_ARGUMENT naming the field for a
// missing or malformed value; UNIMPLEMENTED naming it for a setting this
// runtime does not support (another model_type or architecture,
// activation, scoring function or top-k method for the model type, rope
// scaling type, attention bias, a quantization other than fp8 e4m3).
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_MODEL_CONFIG_H_
