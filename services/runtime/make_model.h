// Generated DeepSeek-V2, V3-family and V4 checkpoints for tests and demos
// (`kvtier make-model`): the same files a Hugging Face checkpoint has, as
// the model's authors publish them, random weights from a seed.
#ifndef KVTIER_SERVICES_RUNTIME_MAKE_MODEL_H_
#define KVTIER_SERVICES_RUNTIME_MAKE_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "services/runtime/model_config.h"

namespace kvtier::runtime {

// "tiny": small in every dimension, and exercising q_lora, YaRN, group-limited
// routing, shared experts and a dense first layer. "lite-attn":
// DeepSeek-V2-Lite's attention (hidden 2048, 16 heads, kv_lora_rank 512,
// qk_nope 128, qk_rope 64, v_head 128, no q_lora) with 2 layers, a small MoE
// and a small vocabulary. "v3-tiny" and "kimi-k2-tiny": DeepSeek-V3's and
// Kimi-K2's configs (model_type, noaux_tc router, FP8 block-scaled
// projections) at small dims, several not multiples of 128 so that scale
// blocks are partial; v3-tiny has an MTP layer. "v4-tiny": DeepSeek-V4's
// architecture (window-only, CSA and HCA layers, hyper-connections, hash
// routing) at small dims, in bf16, one file; "v4-tiny-fp8": the same as
// V4 is released (FP8 projections with E8M0 scales, MXFP4 experts), the
// products' inputs whole blocks of 128.
absl::StatusOr<ModelConfig> PresetConfig(const std::string& preset);

// How many shards a checkpoint of this kind is published in, as make-model
// writes it by default: 1 for V2 (and kvtier's small V4), 3 for the V3
// family (always sharded).
int PublishedShards(const ModelConfig& config);

// Writes config.json and the weights into `out_dir` (created if needed):
// one model.safetensors, or `shards` files plus model.safetensors.index.json.
// Weights as published: bf16, FP8 projections with their F32 block scales
// when the config has quantization_config, F32 router correction biases,
// the MTP layers' tensors after the last layer. Weights keep activations
// O(1): norms near 1, projections N(0, 1/fan_in), a wider lm_head so greedy
// choices have clear margins.
absl::Status MakeModel(const ModelConfig& config, const std::string& out_dir, uint64_t seed, int shards = 1);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_MAKE_MODEL_H_
