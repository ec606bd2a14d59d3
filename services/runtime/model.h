// DeepSeek-V2 forward pass on the CPU, one token at a time, with absorbed MLA
// attention over a sequence's stored latents: full blocks kept in a codec
// (bf16/fp8/int8/int4, as the cache stores them), the partial tail in float.
#ifndef KVTIER_SERVICES_RUNTIME_MODEL_H_
#define KVTIER_SERVICES_RUNTIME_MODEL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/rope.h"
#include "services/runtime/checkpoint.h"

namespace kvtier::runtime {

// One sequence's latents, per layer: sealed blocks of tokens_per_block
// tokens in `codec`, then float rows of the tokens after them. Not
// thread-safe.
struct SequenceCache {
  kernels::Codec codec = kernels::Codec::kBf16;
  uint32_t tokens_per_block = 64;
  int64_t length = 0;  // tokens whose latents are held
  std::vector<std::vector<std::vector<uint8_t>>> blocks;  // [layer][block] payload
  std::vector<std::vector<float>> tail;                  // [layer] rows
};

// Weights in float32, loaded once. Immutable after Load; thread-safe to read.
class Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Load(const Checkpoint& checkpoint);

  const ModelConfig& config() const { return config_; }
  SequenceCache NewCache(kernels::Codec codec, uint32_t tokens_per_block) const;

  // Runs token `token` at position cache.length: appends its latents to
  // `cache` (sealing a block when the tail fills) and writes the next-token
  // logits (vocab_size floats). INVALID_ARGUMENT for a token outside the
  // vocabulary (cache untouched); any later error, which only a cache built
  // for another model can cause, leaves `cache` unusable.
  absl::Status Step(uint32_t token, SequenceCache& cache, std::span<float> logits) const;

  // Runs `tokens` as one causal pass (a prompt, or a prompt's uncached
  // suffix) and writes the logits after the last. Every token of the pass
  // attends over full-precision latents; the blocks it fills are sealed into
  // the codec at the end. Step is Prefill of one token.
  absl::Status Prefill(std::span<const uint32_t> tokens, SequenceCache& cache,
                       std::span<float> logits) const;

 private:
  struct Layer {
    std::vector<float> input_norm, post_norm;
    std::vector<float> q_proj;                 // [heads*q_head, hidden] (no q_lora)
    std::vector<float> q_a, q_a_norm, q_b;     // q_lora form
    std::vector<float> kv_a, kv_a_norm;
    std::vector<float> w_uk, w_uv;             // [heads][nope][kv], [heads][v][kv]
    std::vector<float> o_proj;
    bool moe = false;
    std::vector<float> gate_proj, up_proj, down_proj;  // dense MLP
    std::vector<float> router;                         // [experts, hidden]
    std::vector<std::vector<float>> expert_gate, expert_up, expert_down;
    std::vector<float> shared_gate, shared_up, shared_down;
  };
  Model() = default;
  void Mlp(const Layer& l, std::span<const float> x, std::span<float> out) const;
  // One token through every layer, its latents appended to the tail; the
  // logits only when `logits` is not empty.
  absl::Status RunToken(uint32_t token, SequenceCache& cache, std::span<float> logits) const;
  absl::Status SealFullBlocks(SequenceCache& cache) const;

  ModelConfig config_;
  kernels::RopeTable rope_;
  std::vector<float> embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
};

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_MODEL_H_
