// An Accelerator (accelerator.h) on a GPU, for DeepSeek-V4's backend
// (v4_forward.h), whose window, compressors and indexer stay on the CPU
// until they have kernels of their own. Each matrix is copied up once in
// bf16 (FP8 and FP4 weights dequantized first: FP4, and FP8 with
// power-of-two scales, are exact in bf16); each product uploads its
// inputs, runs cuBLAS (inputs rounded to bf16, sums in float32:
// cuda_matmul.h) and waits for its outputs; attention uploads every row's
// entries and runs cuda_v4_attention.h. Calls from several threads (the
// MoE's experts) take turns. Built only with CUDA (KVTIER_RUNTIME_CUDA).
#ifndef KVTIER_SERVICES_RUNTIME_CUDA_ACCELERATOR_H_
#define KVTIER_SERVICES_RUNTIME_CUDA_ACCELERATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "services/runtime/accelerator.h"

namespace kvtier::runtime {

// FAILED_PRECONDITION when there is no usable GPU (and why).
absl::StatusOr<std::unique_ptr<Accelerator>> NewCudaAccelerator();

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_CUDA_ACCELERATOR_H_
