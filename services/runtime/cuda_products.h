// A ProductDevice (matmul.h) on a GPU, for a backend whose other steps run
// on the CPU: DeepSeek-V4's (v4_forward.h), until its attention has kernels
// of its own. Each matrix is copied up once in bf16 (FP8 and FP4 weights
// dequantized first: FP4, and FP8 with power-of-two scales, are exact in
// bf16); each product uploads its inputs, runs cuBLAS (inputs rounded to
// bf16, sums in float32: cuda_matmul.h) and waits for its outputs.
// Products asked for by several threads (the MoE's experts) take turns.
// Built only with CUDA (KVTIER_RUNTIME_CUDA).
#ifndef KVTIER_SERVICES_RUNTIME_CUDA_PRODUCTS_H_
#define KVTIER_SERVICES_RUNTIME_CUDA_PRODUCTS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "services/runtime/matmul.h"

namespace kvtier::runtime {

// FAILED_PRECONDITION when there is no usable GPU (and why).
absl::StatusOr<std::unique_ptr<ProductDevice>> NewCudaProductDevice();

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_CUDA_PRODUCTS_H_
