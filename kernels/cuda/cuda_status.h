// CUDA errors as kernels::Status, for the .cu files of this directory.
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

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_CUDA_STATUS_H_
