// Stream-ordered allocation for the kernels' workspaces, from a pool that
// keeps its memory: by default cudaMallocAsync's pool gives everything back
// at each synchronization, and every call then maps it again.
#ifndef KVTIER_KERNELS_CUDA_STREAM_MEMORY_H_
#define KVTIER_KERNELS_CUDA_STREAM_MEMORY_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace kvtier::kernels::cuda {

inline cudaError_t MallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  static std::atomic<uint64_t> retained{0};  // one bit per device
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess && device < 64 && !((retained.load() >> device) & 1)) {
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
      uint64_t keep = UINT64_MAX;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    retained.fetch_or(uint64_t{1} << device);
  }
  return cudaMallocAsync(p, bytes, stream);
}

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_STREAM_MEMORY_H_
