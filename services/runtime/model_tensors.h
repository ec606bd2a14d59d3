// The tensors of a DeepSeek-style checkpoint, described once: Hugging Face
// names, shapes, the dtype they are published in, and which layers hold
// them. The checkpoint loader checks the files against this, make-model
// writes it, and both forward backends load their weights from its fields
// (never spelling a name again).
#ifndef KVTIER_SERVICES_RUNTIME_MODEL_TENSORS_H_
#define KVTIER_SERVICES_RUNTIME_MODEL_TENSORS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/runtime/model_config.h"
#include "services/runtime/safetensors.h"

namespace kvtier::runtime {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  // As the model's authors publish it: F8_E4M3 for a projection of an fp8
  // checkpoint, F32 for the router's correction bias, BF16 otherwise.
  DType dtype = DType::kBf16;
  // A projection (row-major [out][in]): stored FP8 with block scales in an
  // fp8 checkpoint, and in a float type in a bf16 cast of one.
  bool projection = false;
};

// An FP8 projection's block scales: "<name>_scale_inv" (".weight" becomes
// ".weight_scale_inv"), float32 [ceil(out / block_rows)][ceil(in / block_cols)].
TensorSpec ScaleSpec(const TensorSpec& projection, const Fp8Quantization& fp8);

// A SwiGLU MLP: down(silu(gate x) * up x).
struct MlpTensors {
  TensorSpec gate, up, down;
  int64_t inter = 0;
};

// V3.2's lightning indexer of a layer: queries from the MLA query latent
// (wq_b), one key a token (wk, then a LayerNorm with weight and bias), and
// each head's weight (weights_proj).
struct IndexerTensors {
  TensorSpec wq_b, wk, k_norm, k_norm_bias, weights_proj;
};

struct LayerTensors {
  TensorSpec input_norm, post_norm;
  std::optional<TensorSpec> q_proj;              // without q_lora
  std::optional<TensorSpec> q_a, q_a_norm, q_b;  // with q_lora
  TensorSpec kv_a, kv_a_norm, kv_b, o_proj;
  std::optional<IndexerTensors> indexer;  // V3.2
  bool moe = false;
  std::optional<MlpTensors> mlp;  // dense layers
  // MoE layers: the router, its noaux_tc correction bias, the shared
  // experts (the routed ones: ExpertTensors, one at a time).
  std::optional<TensorSpec> router, correction_bias;
  std::optional<MlpTensors> shared;
};

struct GlobalTensors {
  TensorSpec embed, final_norm, lm_head;
};

GlobalTensors GlobalTensorsOf(const ModelConfig& config);
LayerTensors LayerTensorsOf(const ModelConfig& config, int64_t layer);
MlpTensors ExpertTensors(const ModelConfig& config, int64_t layer, int64_t expert);

// Every tensor a checkpoint of `config` holds (block scales aside: ScaleSpec),
// one at a time, stopping at the first error `visit` returns: a loader
// checks each against the files without building the list, which a corrupt
// config (a billion layers) could make too large to hold. The MTP layers
// after the last layer are not among them (nothing here runs them).
absl::Status ForEachExpectedTensor(const ModelConfig& config,
                                   const std::function<absl::Status(const TensorSpec&)>& visit);
// The tensors of the multi-token prediction layers (num_nextn_predict_layers,
// stored as layers num_hidden_layers on: a full layer plus enorm, hnorm,
// eh_proj and shared_head), which checkpoints carry and kvtier skips:
// make-model writes them as published.
absl::Status ForEachMtpTensor(const ModelConfig& config, const std::function<absl::Status(const TensorSpec&)>& visit);

// The same as a list.
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_MODEL_TENSORS_H_
