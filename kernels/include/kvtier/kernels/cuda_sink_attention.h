// DeepSeek-V4's attention with sinks (sink_attention.h) on the GPU, for
// many rows at once, each over its own entries (its window, then the
// compressed entries it attends). All pointers are to device memory; the
// call queues on `stream` (a cudaStream_t; null: the default stream) and
// returns without waiting. Built only with CUDA.
#ifndef KVTIER_KERNELS_CUDA_SINK_ATTENTION_H_
#define KVTIER_KERNELS_CUDA_SINK_ATTENTION_H_

#include <cstdint>

#include "kvtier/kernels/sink_attention.h"
#include "kvtier/kernels/status.h"

namespace kvtier::kernels::cuda {

// Row r's entries are entries[offsets[r] * dim ..] ([counts[r]][dim]),
// counts at most max_count. q and out [rows][heads][dim]; sinks [heads];
// scratch [rows][heads][max_count] floats (the scores). A row's sums run
// in another order than the CPU's: within float32 rounding of it.
// INVALID_ARGUMENT for a missing pointer or a zero head count or dim.
Status SinkAttention(const SinkAttentionShape& shape, uint32_t rows, const float* q, const float* entries,
                     const int64_t* offsets, const int32_t* counts, uint32_t max_count, const float* sinks,
                     float* scratch, float* out, void* stream);

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_SINK_ATTENTION_H_
