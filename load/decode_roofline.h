// A decode step's memory roofline, as decode_bench reports it: the bytes a
// step must read at least, to set against the device's copy rate measured
// in the same run. A decode step reads each weight it multiplies by once
// for the whole batch, and every stored latent of every sequence once per
// layer; at batch sizes a decode worker runs, nothing else it reads comes
// close.
#ifndef KVTIER_LOAD_DECODE_ROOFLINE_H_
#define KVTIER_LOAD_DECODE_ROOFLINE_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "kvtier/kernels/codec.h"
#include "services/runtime/model_config.h"
#include "services/runtime/model_tensors.h"

namespace kvtier::load {

struct StepBytes {
  double weights = 0;  // the projections, norms, router and experts a step uses
  double latents = 0;  // every sequence's stored latents, every layer
};

// For `sequences` sequences of `context` tokens each, one new token each.
// Weights count in the dtype the checkpoint publishes them in (bf16; an
// FP8 checkpoint's projections at 1 byte plus their block scales, as the
// CPU reads them: the least any device reads them in); the embeddings only
// the batch's rows; of each MoE layer's routed experts as many as the batch
// can choose (top-k per sequence, at most all of them). Latents: each
// layer's whole blocks as `codec` stores them and the partial block's
// tokens as float32, as a sequence's cache holds them.
inline StepBytes DecodeStepBytes(const runtime::ModelConfig& c, size_t sequences, size_t context, kernels::Codec codec,
                                 uint32_t tokens_per_block) {
  const int64_t experts_chosen = std::min<int64_t>(c.n_routed_experts, sequences * c.num_experts_per_tok);
  StepBytes bytes;
  (void)runtime::ForEachExpectedTensor(c, [&](const runtime::TensorSpec& t) {
    double elements = 1;
    for (int64_t d : t.shape) elements *= d;
    if (t.name == "model.embed_tokens.weight") elements = double(sequences) * c.hidden_size;
    // "model.layers.L.mlp.experts.E.<proj>.weight": only the first
    // experts_chosen experts of a layer count (all are the same size).
    const std::string experts = ".mlp.experts.";
    if (size_t at = t.name.find(experts); at != std::string::npos) {
      const size_t from = at + experts.size();
      int64_t expert = 0;
      if (absl::SimpleAtoi(t.name.substr(from, t.name.find('.', from) - from), &expert) && expert >= experts_chosen) {
        return absl::OkStatus();
      }
    }
    bytes.weights += static_cast<double>(runtime::DTypeBytes(t.dtype)) * elements;
    if (t.dtype == runtime::DType::kF8E4m3) {
      const runtime::TensorSpec scales = runtime::ScaleSpec(t, *c.fp8);
      bytes.weights += sizeof(float) * static_cast<double>(scales.shape[0] * scales.shape[1]);
    }
    return absl::OkStatus();
  });
  const auto latent = static_cast<uint32_t>(c.kv_lora_rank), rope = static_cast<uint32_t>(c.qk_rope_head_dim);
  const double block = static_cast<double>(kernels::EncodedBytes(codec, {tokens_per_block, latent, rope}));
  const double per_layer =
      double(context / tokens_per_block) * block + double(context % tokens_per_block) * (latent + rope) * sizeof(float);
  bytes.latents = double(sequences) * c.num_hidden_layers * per_layer;
  return bytes;
}

// What DeepSeek-V3.2's sparse step reads of the sequences' attention state
// in place of StepBytes::latents, past index_topk tokens: every held
// token's indexer key (codes and scale), and of the latents only the
// index_topk chosen tokens' rows plus the block-wide part (per-channel
// scales) of at most that many blocks. Within index_topk tokens it
// attends densely: the latents and the keys. Contexts of whole blocks.
inline double SparseStepStateBytes(const runtime::ModelConfig& c, size_t sequences, size_t context,
                                   kernels::Codec codec, uint32_t tokens_per_block) {
  const runtime::IndexerConfig& ix = *c.indexer;
  const double keys = double(context) * double(ix.head_dim + sizeof(float));
  const auto topk = static_cast<size_t>(ix.topk);
  if (context <= topk) {
    return DecodeStepBytes(c, sequences, context, codec, tokens_per_block).latents +
           double(sequences) * c.num_hidden_layers * keys;
  }
  const auto latent = static_cast<uint32_t>(c.kv_lora_rank), rope = static_cast<uint32_t>(c.qk_rope_head_dim);
  const double one = static_cast<double>(kernels::EncodedBytes(codec, {1, latent, rope}));
  const double two = static_cast<double>(kernels::EncodedBytes(codec, {2, latent, rope}));
  const double per_token = two - one, per_block = 2 * one - two;
  const double chosen = double(topk) * per_token + double(std::min(context / tokens_per_block, topk)) * per_block;
  return double(sequences) * c.num_hidden_layers * (keys + chosen);
}

}  // namespace kvtier::load

#endif  // KVTIER_LOAD_DECODE_ROOFLINE_H_
