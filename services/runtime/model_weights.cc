#include "services/runtime/model_weights.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
#include "services/runtime/v4_tensors.h"

namespace kvtier::runtime {

absl::StatusOr<WeightMatrix> LoadMatrix(const Checkpoint& checkpoint, const TensorSpec& spec) {
  KVTIER_ASSIGN_OR_RETURN(const TensorView t, checkpoint.Tensor(spec.name));
  if (t.dtype != DType::kF8E4m3 && t.dtype != DType::kI8) return ToWeightMatrix(t);
  // Checkpoint::Open checked that the scales exist with their shape.
  const ModelConfig& c = checkpoint.config();
  const Fp8Quantization& fp8 = *c.fp8;
  const TensorSpec scale_spec = c.v4.has_value() ? V4ScaleSpec(spec, c) : ScaleSpec(spec, fp8);
  KVTIER_ASSIGN_OR_RETURN(const TensorView scales, checkpoint.Tensor(scale_spec.name));
  WeightMatrix w;
  std::vector<float>& scale_values = t.dtype == DType::kI8 ? w.fp4_scales : w.fp8_scales;
  scale_values = scales.ToFloat();
  for (size_t i = 0; i < scale_values.size(); ++i) {
    if (!std::isfinite(scale_values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("block scale tensor ", scale_spec.name, " holds ", scale_values[i], " at element ", i));
    }
  }
  if (t.dtype == DType::kI8) {  // MXFP4: every byte is two codes
    w.fp4.assign(t.bytes.begin(), t.bytes.end());
    return w;
  }
  w.fp8.assign(t.bytes.begin(), t.bytes.end());
  for (size_t i = 0; i < w.fp8.size(); ++i) {
    if ((w.fp8[i] & 0x7fu) == 0x7fu) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", spec.name, " holds an FP8 NaN (code 0x", absl::Hex(w.fp8[i]), ") at element ", i));
    }
  }
  w.fp8_block_rows = static_cast<size_t>(fp8.block_rows);
  w.fp8_block_cols = static_cast<size_t>(fp8.block_cols);
  return w;
}

absl::StatusOr<std::vector<float>> LoadFloats(const Checkpoint& checkpoint, const TensorSpec& spec) {
  KVTIER_ASSIGN_OR_RETURN(const TensorView t, checkpoint.Tensor(spec.name));
  if (t.dtype != DType::kF8E4m3 && t.dtype != DType::kI8) return t.ToFloat();
  KVTIER_ASSIGN_OR_RETURN(const WeightMatrix w, LoadMatrix(checkpoint, spec));
  const size_t rows = static_cast<size_t>(spec.shape[0]);
  const size_t cols = static_cast<size_t>(spec.shape[1]) * (t.dtype == DType::kI8 ? 2 : 1);
  std::vector<float> values(rows * cols);
  WidenRows(w, cols, 0, rows, values.data());
  return values;
}

}  // namespace kvtier::runtime
