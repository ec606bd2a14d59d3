// RMSNorm and RoPE kernels (cuda_layers.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda_status.h"
#include "kvtier/kernels/cuda_layers.h"

namespace kvtier::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// One CUDA block per row: a tree sum of squares, then the scaled row.
__global__ void __launch_bounds__(kThreads)
    RmsNormKernel(const float* x, const float* weight, uint32_t dim, float eps, float* out) {
  __shared__ float partial[kThreads];
  const float* row = x + size_t{blockIdx.x} * dim;
  float sum = 0.0f;
  for (uint32_t c = threadIdx.x; c < dim; c += kThreads) sum += row[c] * row[c];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  const float inv = 1.0f / sqrtf(partial[0] / static_cast<float>(dim) + eps);
  float* o = out + size_t{blockIdx.x} * dim;
  for (uint32_t c = threadIdx.x; c < dim; c += kThreads) o[c] = weight[c] * (row[c] * inv);
}

// The table's frequencies, passed by value with the launch: no device copy
// to allocate, and nothing on the host that the queued kernel still reads.
struct RopeFrequencies {
  double inv[kThreads];
};

// One thread per (row, vector, pair): reads its interleaved pair (2i, 2i+1)
// and writes the rotated values to i and half + i. A vector's threads all
// read before any writes (the vector sits in one CUDA block, which syncs),
// since pair i's outputs overwrite other pairs' inputs.
__global__ void __launch_bounds__(kThreads)
    RopeKernel(const RopeFrequencies freq, double mscale, uint32_t half, const int64_t* positions, float* x,
               uint32_t vectors, size_t row_stride, size_t vector_stride) {
  const uint32_t r = blockIdx.y;
  const uint32_t v = blockIdx.x * (kThreads / half) + threadIdx.x / half, i = threadIdx.x % half;
  const bool active = threadIdx.x < (kThreads / half) * half && v < vectors;
  float* vec = x + r * row_stride + size_t{v} * vector_stride;
  float a = 0.0f, b = 0.0f;
  if (active) a = vec[2 * i], b = vec[2 * i + 1];
  __syncthreads();
  if (!active) return;
  const double angle = static_cast<double>(positions[r]) * freq.inv[i];
  const float c = static_cast<float>(cos(angle) * mscale), s = static_cast<float>(sin(angle) * mscale);
  vec[i] = a * c - b * s;
  vec[half + i] = b * c + a * s;
}

__global__ void AddKernel(float* x, const float* y, size_t n) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < n) x[i] += y[i];
}

}  // namespace

Status RmsNorm(const float* x, const float* weight, uint32_t rows, uint32_t dim, float eps, float* out, void* stream) {
  if (x == nullptr || weight == nullptr || out == nullptr || dim == 0) {
    return InvalidArgument("cuda::RmsNorm: missing pointer or zero dim");
  }
  if (rows == 0) return OkStatus();
  RmsNormKernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, weight, dim, eps, out);
  return Launched("cuda::RmsNorm");
}

Status ApplyRope(const RopeTable& table, const int64_t* positions, float* x, uint32_t rows, uint32_t vectors,
                 size_t row_stride, size_t vector_stride, void* stream_ptr) {
  const uint32_t half = table.dim() / 2;
  if (half == 0 || half > kThreads || positions == nullptr || x == nullptr || vectors == 0) {
    return InvalidArgument("cuda::ApplyRope: rope dim must be 2.." + std::to_string(2 * kThreads) +
                           ", pointers and vectors given");
  }
  if (rows == 0) return OkStatus();
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  RopeFrequencies freq{};
  std::copy_n(table.inv_freq().begin(), half, freq.inv);
  const uint32_t per_block = kThreads / half;
  // Rows on the grid's y axis, at most 65535 a launch (a long prefill has more).
  constexpr uint32_t kMaxRows = 65535;
  for (uint32_t first = 0; first < rows; first += kMaxRows) {
    RopeKernel<<<dim3((vectors + per_block - 1) / per_block, std::min(kMaxRows, rows - first)), kThreads, 0, stream>>>(
        freq, table.mscale(), half, positions + first, x + first * row_stride, vectors, row_stride, vector_stride);
  }
  return Launched("cuda::ApplyRope");
}

Status AddInPlace(float* x, const float* y, size_t n, void* stream_ptr) {
  if (x == nullptr || y == nullptr) return InvalidArgument("cuda::AddInPlace: missing pointer");
  if (n == 0) return OkStatus();
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  AddKernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, y, n);
  return Launched("cuda::AddInPlace");
}

}  // namespace kvtier::kernels::cuda
