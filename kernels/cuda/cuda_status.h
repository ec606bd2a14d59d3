// CUDA errors as kernels::Status, and early return on a bad one, for the .cu
// files of this directory.
#ifndef KVTIER_KERNELS_CUDA_CUDA_STATUS_H_
#define KVTIER_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include <string>

#include "kvtier/kernels/status.h"

namespace kvtier::kernels::cuda {

// INTERNAL, naming `what` and CUDA's message.
inline Status CudaError(cudaError_t e, const char* what) {
  return Status(StatusCode::kInternal, std::string(what) + ": " + cudaGetErrorString(e));
}

// The last launch's own error (INTERNAL naming `what`); faults while a
// queued kernel runs show at the caller's next wait on its stream.
inline Status Launched(const char* what) {
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return CudaError(e, what);
  return Status();
}

}  // namespace kvtier::kernels::cuda

// Returns the Status of `expr` from the enclosing function unless it is OK.
#define KVTIER_KERNELS_RETURN_IF_ERROR(expr)           \
  do {                                                 \
    ::kvtier::kernels::Status kvtier_status_ = (expr); \
    if (!kvtier_status_.ok()) return kvtier_status_;   \
  } while (0)

#endif  // KVTIER_KERNELS_CUDA_CUDA_STATUS_H_
