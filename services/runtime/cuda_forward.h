// Model's forward pass on a GPU (--device cuda): the layers of
// cpu_forward.cc with bf16 weights in device memory (an FP8 checkpoint's
// dequantized at load, until an FP8 GEMM can be measured on a GPU) and
// cuBLAS products (kernels/cuda),
// and every row's attention absorbed over its sequence's quantized blocks
// and float tail by the paged MLA kernel, prefill rows and decode steps
// alike. Sequence caches stay in host memory, where the serving layer reads
// and writes their blocks; the GPU keeps copies of them between passes in a
// device block pool (device_block_pool.h) and copies up only the blocks it
// does not hold. Blocks are sealed on the host with the CPU codecs (the
// GPU's give the same bytes). Built only with CUDA (KVTIER_RUNTIME_CUDA).
#ifndef KVTIER_SERVICES_RUNTIME_CUDA_FORWARD_H_
#define KVTIER_SERVICES_RUNTIME_CUDA_FORWARD_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kvtier/kernels/rope.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/model.h"

namespace kvtier::runtime {

// Uploads the checkpoint's weights to the current GPU. FAILED_PRECONDITION
// when there is no usable GPU (and why); RESOURCE_EXHAUSTED when the
// weights do not fit.
absl::StatusOr<std::unique_ptr<ForwardBackend>> LoadCudaForward(const Checkpoint& checkpoint,
                                                                const kernels::RopeTable& rope,
                                                                const CudaOptions& options);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_CUDA_FORWARD_H_
