#include "services/runtime/accelerator.h"

#include "kvtier/kernels/indexer.h"
#include "kvtier/kernels/parallel.h"

namespace kvtier::runtime {

void ChooseKeysOnCpu(const IndexerQueries& queries, std::vector<std::vector<uint32_t>>& chosen) {
  const size_t width = size_t{queries.heads} * queries.dim;
  chosen.assign(queries.visible.size(), {});
  kernels::ParallelFor(chosen.size(), 1, [&](size_t begin, size_t end) {
    std::vector<float> scores;
    for (size_t r = begin; r < end; ++r) {
      scores.resize(queries.visible[r]);
      kernels::V4IndexerScores(queries.heads, queries.dim, queries.q + r * width, queries.weights + r * queries.heads,
                               queries.keys[r].data(), scores.size(), scores.data());
      kernels::SelectTopTokens(scores, queries.k, chosen[r]);
    }
  });
}

void SinkAttentionOnCpu(const kernels::SinkAttentionShape& shape, std::span<const std::vector<float>> entries,
                        const float* q, const float* sinks, float* out) {
  const size_t row = size_t{shape.heads} * shape.dim;
  kernels::ParallelFor(entries.size(), 1, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      kernels::SinkAttention(shape, q + r * row, entries[r].data(), entries[r].size() / shape.dim, sinks,
                             out + r * row);
    }
  });
}

}  // namespace kvtier::runtime
