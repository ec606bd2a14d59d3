// RMSNorm and DeepSeek's RoPE on the GPU, the same mathematics as the CPU's
// RmsNorm (layers.h) and RopeTable::Apply (rope.h), over many rows at once.
// All pointers are device memory. Each queues its kernel on `stream` (a
// cudaStream_t; null: the default stream) and returns without waiting: the
// caller waits before reading the results (a fault while the kernel runs
// shows at that wait). INVALID_ARGUMENT for sizes that do not fit; INTERNAL
// for a launch that fails. Built only with CUDA.
#ifndef KVTIER_KERNELS_CUDA_LAYERS_H_
#define KVTIER_KERNELS_CUDA_LAYERS_H_

#include <cstddef>
#include <cstdint>

#include "kvtier/kernels/rope.h"
#include "kvtier/kernels/status.h"

namespace kvtier::kernels::cuda {

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight for `rows` rows of `dim`
// floats (x and out may be the same).
Status RmsNorm(const float* x, const float* weight, uint32_t rows, uint32_t dim, float eps, float* out, void* stream);

// Rotates, in place, `vectors` rope vectors of each of `rows` rows by the
// row's position: vector v of row r starts at x + r * row_stride + v *
// vector_stride (floats) and has table.dim() values, interleaved pairs in,
// de-interleaved out, as RopeTable::Apply. `positions`: [rows].
Status ApplyRope(const RopeTable& table, const int64_t* positions, float* x, uint32_t rows, uint32_t vectors,
                 size_t row_stride, size_t vector_stride, void* stream);

// x[i] += y[i] for n floats (a residual connection).
Status AddInPlace(float* x, const float* y, size_t n, void* stream);

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_LAYERS_H_
