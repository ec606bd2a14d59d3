// The tensors of a DeepSeek-V4 checkpoint, by DeepSeek's own names (as
// released: embed.weight, layers.{i}.attn.*, layers.{i}.ffn.*,
// layers.{i}.hc_*, head.weight, hc_head_*), shapes and dtypes. The
// checkpoint loader checks the files against them, make-model writes them,
// v4_forward.h loads from them. The MTP layers (mtp.*) are not among them:
// nothing here runs them. In a checkpoint as released (quantization_config)
// the projections are F8_E4M3 and the routed experts, with expert_dtype
// fp4, I8 bytes of two E2M1 codes each ([out][in / 2]); each has its
// F8_E8M0 scales in "<name>.scale" (V4ScaleSpec).
#ifndef KVTIER_SERVICES_RUNTIME_V4_TENSORS_H_
#define KVTIER_SERVICES_RUNTIME_V4_TENSORS_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "services/runtime/model_config.h"
#include "services/runtime/model_tensors.h"

namespace kvtier::runtime {

// Hyper-connection mixing: fn [(2 + hc) * hc][hc * hidden], base
// [(2 + hc) * hc], scale [3] (pre, post, comb); the head's: fn [hc][hc *
// hidden], base [hc], scale [1].
struct V4HcTensors {
  TensorSpec fn, base, scale;
};

// A compressor: ape [ratio][coff * dim] (coff 2 when groups overlap, at
// ratio 4), wkv and wgate [coff * dim][hidden], norm [dim].
struct V4CompressorTensors {
  TensorSpec ape, wkv, wgate, norm;
};

// A CSA layer's indexer: queries from the query latent (wq_b), each head's
// weight from the layer input (weights_proj), keys from its own compressor.
struct V4IndexerTensors {
  TensorSpec wq_b, weights_proj;
  V4CompressorTensors compressor;
};

struct V4LayerTensors {
  V4HcTensors hc_attn, hc_ffn;
  TensorSpec attn_norm, ffn_norm;
  TensorSpec attn_sink, wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b;
  std::optional<V4CompressorTensors> compressor = {};  // compressed layers
  std::optional<V4IndexerTensors> indexer = {};        // ratio 4
  TensorSpec gate;
  std::optional<TensorSpec> gate_bias = {};  // score-routed layers
  std::optional<TensorSpec> tid2eid = {};    // hash-routed layers: [vocab][experts_per_tok] expert ids
  MlpTensors shared;                         // w1 = gate, w3 = up, w2 = down
};

struct V4GlobalTensors {
  TensorSpec embed, norm, head;
  V4HcTensors hc_head;
};

V4GlobalTensors V4GlobalTensorsOf(const ModelConfig& config);
// The scales of an FP8 projection ([ceil(out / rows)][ceil(in / cols)] of
// the weight block) or an FP4 one ([out][in / 32]): "<name>.scale",
// F8_E8M0 as released (F32 is accepted too).
TensorSpec V4ScaleSpec(const TensorSpec& projection, const ModelConfig& config);
V4LayerTensors V4LayerTensorsOf(const ModelConfig& config, int64_t layer);
MlpTensors V4ExpertTensors(const ModelConfig& config, int64_t layer, int64_t expert);

// Every tensor, one at a time, stopping at the first error `visit` returns.
absl::Status ForEachV4Tensor(const ModelConfig& config, const std::function<absl::Status(const TensorSpec&)>& visit);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_V4_TENSORS_H_
