// DeepSeek-V3.2's sparse attention on the CPU: each layer's lightning
// indexer (kernels/indexer.h) keys every new token into its sequence's
// cache and chooses, for each row of a pass, the index_topk earlier tokens
// MLA attends to; the chosen tokens' latents gathered as float rows.
#ifndef KVTIER_SERVICES_RUNTIME_SPARSE_ATTENTION_H_
#define KVTIER_SERVICES_RUNTIME_SPARSE_ATTENTION_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kvtier/kernels/rope.h"
#include "services/runtime/matmul.h"
#include "services/runtime/model.h"

namespace kvtier::runtime {

// A layer's indexer weights (model_tensors.h's IndexerTensors).
struct IndexerWeights {
  WeightMatrix wq_b, wk;
  std::vector<float> k_norm, k_norm_bias;
  std::vector<float> weights_proj;  // [heads][hidden]
};

// One row of a forward pass: its sequence and position.
struct PassRow {
  SequenceCache* cache;
  int64_t pos;
};

// A pass's rows: one a token, sequences one after another.
std::vector<PassRow> PassRows(std::span<const SequenceTokens> batch);

// The pass's raw key projections (keys: [rows][head_dim], wk's output),
// normalised (k_norm, k_norm_bias), rotated and rounded here, appended to
// each row's cache's layer `layer` in row order.
absl::Status AppendIndexKeys(const kernels::RopeTable& rope, std::span<const float> k_norm,
                             std::span<const float> k_norm_bias, size_t layer, std::span<const PassRow> rows,
                             std::span<float> keys);

// One row's indexer query at `pos` (queries: wq_b's output, [heads]
// [head_dim], rotated and rounded here; head_weights: weights_proj's
// output, [heads]) as IndexerScores takes it: q_codes [heads][head_dim],
// weights [heads] (each head's weight with its scales folded in).
absl::Status IndexQuery(const IndexerConfig& ix, const kernels::RopeTable& rope, int64_t pos, std::span<float> queries,
                        std::span<const float> head_weights, std::span<uint8_t> q_codes, std::span<float> weights);

// For the pass's rows (h: their attention inputs [n][hidden]; qa: their
// MLA query latents [n][q_lora]): appends each row's key to its cache's
// layer `layer`, then fills selected[r] with the tokens row r attends to,
// ascending, when the row sees more than index_topk tokens (its own
// included; empty: it sees all of them). Rows of one sequence come in
// position order.
absl::Status IndexRows(const ModelConfig& config, const kernels::RopeTable& rope, const IndexerWeights& w, size_t layer,
                       std::span<const PassRow> rows, const float* h, const float* qa,
                       std::vector<std::vector<uint32_t>>& selected);

// The latents (kv_lora_rank + rope values a token, as float) of `tokens`
// (ascending) of `cache`'s layer `layer`: each block's chosen tokens
// decoded from their bytes and the block's scales alone, tail rows copied.
absl::Status GatherLatents(const SequenceCache& cache, size_t layer, std::span<const uint32_t> tokens,
                           uint32_t kv_lora_rank, uint32_t rope_dim, std::vector<float>& out);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_SPARSE_ATTENTION_H_
