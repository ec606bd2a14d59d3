// DeepSeek-V4's forward pass on the CPU, as DeepSeek's V4-Flash
// inference/model.py computes it, one position at a time (its decode
// path, which a prompt's positions take in order): per layer the sliding
// window of full entries, the compressors' entries as their groups close,
// the CSA indexer's top-k choice, attention with sinks, inverse RoPE and
// the grouped output projection; hyper-connections around each half; MoE
// with sqrt(softplus) scores, hash routing in the first layers and a
// clamped SwiGLU. The model's FP8 rounding of entries and FP4 rounding of
// indexer values (kernels/qat_rounding.h) are applied where it applies
// them. Each sequence's state is its cache's v4 part (v4_state.h). Weights
// bf16 or float32; a sequence's results do not depend on the batch.
// With an Accelerator (--device cuda: cuda_accelerator.h) the
// projections, experts, head and attention run there, the rest as here; a
// sequence's results then depend on the batch as much as the
// accelerator's sums do.
#ifndef KVTIER_SERVICES_RUNTIME_V4_FORWARD_H_
#define KVTIER_SERVICES_RUNTIME_V4_FORWARD_H_

#include <memory>

#include "absl/status/statusor.h"
#include "services/runtime/accelerator.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/model.h"

namespace kvtier::runtime {

absl::StatusOr<std::unique_ptr<ForwardBackend>> LoadV4Forward(const Checkpoint& checkpoint,
                                                              std::unique_ptr<Accelerator> device = nullptr);

// A fresh sequence's per-layer state for `config` (a V4 one).
std::vector<V4LayerState> NewV4State(const ModelConfig& config);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_V4_FORWARD_H_
