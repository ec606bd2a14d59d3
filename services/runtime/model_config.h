// DeepSeek-V2 model configuration, read from a Hugging Face config.json
// (model_type "deepseek_v2"), and the tensors such a checkpoint must hold.
#ifndef KVTIER_SERVICES_RUNTIME_MODEL_CONFIG_H_
#define KVTIER_SERVICES_RUNTIME_MODEL_CONFIG_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/rope.h"

namespace kvtier::runtime {

enum class TopkMethod { kGreedy, kGroupLimitedGreedy };

// Plain value type.
struct ModelConfig {
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

  int64_t q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Layers from first_k_dense_replace on, every moe_layer_freq-th, are MoE.
  bool IsMoeLayer(int64_t layer) const;
  // How the MoE layers' gate picks and weighs experts.
  kernels::GateParams Gate() const;
  // q_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN, as
  // DeepSeek-V2's modeling code computes it.
  double SoftmaxScale() const;

  // The fields as config.json spells them (what make-model writes).
  std::string ToJson() const;
};

// Parses and checks config.json text. INVALID_ARGUMENT naming the field for a
// missing or malformed value; UNIMPLEMENTED naming it for a setting this
// runtime does not support (another model_type, activation, scoring
// function, rope scaling type, attention bias).
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text);

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor a checkpoint of `config` holds, with Hugging Face names.
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);
// The same tensors one at a time, stopping at the first error `visit`
// returns: a loader checks each against the files without building the
// list, which a corrupt config (a billion layers) could make too large to
// hold.
absl::Status ForEachExpectedTensor(const ModelConfig& config,
                                   const std::function<absl::Status(const TensorSpec&)>& visit);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_MODEL_CONFIG_H_
