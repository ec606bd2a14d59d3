// DeepSeek-V4's attention on the GPU, for many rows at once: the CSA
// indexer's scores of a row's compressed keys (its top-k then chosen by
// cuda_sparse_mla.h's SelectTopTokens), and attention with sinks
// (sink_attention.h) over each row's own entries (its window, then the
// compressed entries it attends). All pointers are to device memory;
// every call queues on `stream` (a cudaStream_t; null: the default
// stream) and returns without waiting. Built only with CUDA.
#ifndef KVTIER_KERNELS_CUDA_V4_ATTENTION_H_
#define KVTIER_KERNELS_CUDA_V4_ATTENTION_H_

#include <cstdint>

#include "kvtier/kernels/sink_attention.h"
#include "kvtier/kernels/status.h"

namespace kvtier::kernels::cuda {

// scores[r][g] = sum_h weights[r][h] * max(q[r][h] . key_g, 0) (heads
// added in order) for the first visible[r] keys of row r's sequence, which
// start at keys[key_offsets[r] * dim] ([*][dim]); entries past visible[r]
// untouched. q [rows][heads][dim], weights [rows][heads], scores
// [rows][max_visible]. kernels::V4IndexerScores within float32
// rounding. dim a multiple of 32 up to 512 and heads * dim up to 12,288;
// else INVALID_ARGUMENT.
Status V4IndexerScores(uint32_t heads, uint32_t dim, uint32_t rows, const float* q, const float* weights,
                       const float* keys, const int64_t* key_offsets, const int32_t* visible, uint32_t max_visible,
                       float* scores, void* stream);

// Row r's entries are entries[offsets[r] * dim ..] ([counts[r]][dim]),
// counts at most max_count. q and out [rows][heads][dim]; sinks [heads];
// scratch [rows][heads][max_count] floats (the scores). A row's sums run
// in another order than the CPU's: within float32 rounding of it.
// INVALID_ARGUMENT for a missing pointer, a zero head count, or a dim of
// 0 or over 512.
Status SinkAttention(const SinkAttentionShape& shape, uint32_t rows, const float* q, const float* entries,
                     const int64_t* offsets, const int32_t* counts, uint32_t max_count, const float* sinks,
                     float* scratch, float* out, void* stream);

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_V4_ATTENTION_H_
