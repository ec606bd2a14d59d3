// An accelerator that a CPU backend hands its heavy steps to: the
// products of its weight matrices, and DeepSeek-V4's indexer and
// attention with sinks (cuda_accelerator.h on a GPU). V4's backend (v4_forward.h) uses one for
// --device cuda, until its whole pass has kernels of its own.
#ifndef KVTIER_SERVICES_RUNTIME_ACCELERATOR_H_
#define KVTIER_SERVICES_RUNTIME_ACCELERATOR_H_

#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kvtier/kernels/sink_attention.h"
#include "services/runtime/matmul.h"

namespace kvtier::runtime {

// DeepSeek-V4's indexer queries of a pass: row r's query (q + r * heads *
// dim) and head weights (weights + r * heads) score the first visible[r]
// keys of keys[r] ([*][dim]; the rows of one sequence share its keys).
struct IndexerQueries {
  uint32_t heads = 0, dim = 0;
  size_t k = 0;  // entries each row chooses
  const float* q = nullptr;
  const float* weights = nullptr;
  std::vector<std::span<const float>> keys;
  std::vector<uint32_t> visible;
};

class Accelerator {
 public:
  virtual ~Accelerator() = default;
  // Copies w ([elements / cols][cols]) to the accelerator and sets
  // w.device, releasing w's host arrays.
  virtual absl::Status Place(WeightMatrix& w, size_t cols) = 0;
  // The first failure among the products since the last call, which
  // clears it (products return none).
  virtual absl::Status TakeError() = 0;
  // chosen[r] = the min(k, visible[r]) keys of highest score for each row
  // (kernels::V4IndexerScores, then SelectTopTokens), in any order.
  virtual absl::Status ChooseKeys(const IndexerQueries& queries, std::vector<std::vector<uint32_t>>& chosen) = 0;
  // kernels::SinkAttention for every row at once: q [rows][heads][dim],
  // row r's entries entries[r] ([*][dim]), out [rows][heads][dim].
  virtual absl::Status SinkAttention(const kernels::SinkAttentionShape& shape,
                                     std::span<const std::vector<float>> entries, const float* q, const float* sinks,
                                     float* out) = 0;
};

// The CPU's ChooseKeys and SinkAttention (what a backend without an
// accelerator runs), rows split over the kernel threads; a row's result
// does not depend on how.
void ChooseKeysOnCpu(const IndexerQueries& queries, std::vector<std::vector<uint32_t>>& chosen);
void SinkAttentionOnCpu(const kernels::SinkAttentionShape& shape, std::span<const std::vector<float>> entries,
                        const float* q, const float* sinks, float* out);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_ACCELERATOR_H_
