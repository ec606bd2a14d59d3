// A checkpoint's tensors as the forward backends hold them, by their
// model_tensors.h description: projections as stored (bf16, or FP8 with
// its block scales), or every tensor widened to float32.
#ifndef KVTIER_SERVICES_RUNTIME_MODEL_WEIGHTS_H_
#define KVTIER_SERVICES_RUNTIME_MODEL_WEIGHTS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/matmul.h"
#include "services/runtime/model_tensors.h"

namespace kvtier::runtime {

// The tensor as the CPU multiplies by it: bf16, FP8 and DeepSeek-V4's
// MXFP4 (with their scales) kept as they are, f16 and f32 as float32. INVALID_ARGUMENT naming the
// tensor for an FP8 NaN code or a scale that is not finite: a checkpoint
// whose weights would make every output NaN.
absl::StatusOr<WeightMatrix> LoadMatrix(const Checkpoint& checkpoint, const TensorSpec& spec);

// The tensor's values as float32, an FP8 one dequantized (its codes times
// their block scales, as LoadMatrix's products read them). Errors as
// LoadMatrix's.
absl::StatusOr<std::vector<float>> LoadFloats(const Checkpoint& checkpoint, const TensorSpec& spec);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_MODEL_WEIGHTS_H_
