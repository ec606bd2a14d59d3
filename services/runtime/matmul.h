// Weights kept as the checkpoint stores them, and the two ways the CPU
// runtime reads them: row-major products and single rows (embeddings). A
// matrix placed on an accelerator (accelerator.h) has its products run
// there instead.
#ifndef KVTIER_SERVICES_RUNTIME_MATMUL_H_
#define KVTIER_SERVICES_RUNTIME_MATMUL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/qat_rounding.h"
#include "services/runtime/safetensors.h"

namespace kvtier::runtime {

// A weight matrix's copy on an accelerator, which computes its products
// there (Accelerator::Place makes one).
class DeviceMatrix {
 public:
  virtual ~DeviceMatrix() = default;
  // y[i][0, rows) = rows [row_begin, row_begin + rows) of W ([*][cols])
  // times x[i], for n inputs `x_stride` floats apart, outputs `y_stride`
  // apart. It returns nothing, as MatMul does: a failure is kept by the
  // accelerator (Accelerator::TakeError) and its outputs are NaN.
  virtual void Multiply(size_t row_begin, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
                        size_t y_stride) const = 0;
  // Whether the checkpoint stored it in FP8 or FP4 (WeightMatrix::quantized).
  virtual bool quantized() const = 0;
};

// A projection's weights [rows][cols] as the checkpoint stores them: bf16
// stays bf16 (half the memory, and half the bytes a decode step reads),
// block-scaled FP8 stays FP8 with its scales (a quarter), other dtypes
// become float32; DeepSeek-V4's MXFP4 experts stay MXFP4 (an eighth). One
// of the four is filled. Products are the same bits as over the weights
// widened to float32 first.
struct WeightMatrix {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> fp8;       // E4M3 codes
  std::vector<float> fp8_scales;  // [ceil(rows / block_rows)][ceil(cols / block_cols)]
  size_t fp8_block_rows = 0, fp8_block_cols = 0;
  std::vector<uint8_t> fp4;       // E2M1 codes, two a byte
  std::vector<float> fp4_scales;  // [rows][cols / 32]
  // Set when the matrix lives on an accelerator: the four above are empty
  // then, and products run there.
  std::shared_ptr<const DeviceMatrix> device;

  size_t bytes() const {
    return f32.size() * sizeof(float) + bf16.size() * sizeof(uint16_t) + fp8.size() +
           fp8_scales.size() * sizeof(float) + fp4.size() + fp4_scales.size() * sizeof(float);
  }
  // Values held on the host (an FP4 byte holds two).
  size_t values() const { return bf16.size() + f32.size() + fp8.size() + 2 * fp4.size(); }
  // Stored in FP8 or FP4 (DeepSeek-V4 rounds the inputs of these products).
  bool quantized() const { return !fp8.empty() || !fp4.empty() || (device != nullptr && device->quantized()); }
  kernels::Fp8BlockScaled Fp8() const { return {fp8.data(), fp8_scales.data(), fp8_block_rows, fp8_block_cols}; }
  kernels::Fp4Scaled Fp4() const { return {fp4.data(), fp4_scales.data()}; }
};

// A bf16, f16 or f32 checkpoint tensor as a WeightMatrix (its bf16 copied
// as it is); model_weights.h loads FP8 ones with their scales.
inline WeightMatrix ToWeightMatrix(const TensorView& t) {
  WeightMatrix w;
  if (t.dtype == DType::kBf16) {
    w.bf16.resize(static_cast<size_t>(t.elements()));
    std::memcpy(w.bf16.data(), t.bytes.data(), w.bf16.size() * sizeof(uint16_t));
  } else {
    w.f32 = t.ToFloat();
  }
  return w;
}

// y[n][rows] = x[n][cols] W^T for W [rows][cols]: each weight row read once
// for all n inputs.
inline void MatMul(const WeightMatrix& w, size_t rows, size_t cols, const float* x, size_t n, float* y) {
  if (w.device != nullptr) {
    w.device->Multiply(0, rows, cols, x, n, cols, y, rows);
  } else if (!w.bf16.empty()) {
    kernels::GemmBf16(w.bf16.data(), rows, cols, x, n, cols, y, rows);
  } else if (!w.fp8.empty()) {
    kernels::GemmFp8(w.Fp8(), rows, cols, x, n, cols, y, rows);
  } else if (!w.fp4.empty()) {
    kernels::GemmFp4(w.Fp4(), rows, cols, x, n, cols, y, rows);
  } else {
    kernels::Gemm(w.f32.data(), rows, cols, x, n, cols, y, rows);
  }
}

// MatMul as DeepSeek-V4's linear layers compute it: over FP8 or FP4
// weights their GEMMs first round each input row to FP8 (blocks of 128,
// power-of-two scales; cols a multiple of 128), so this does too; over
// other weights it is MatMul.
inline void MatMulRoundingInputs(const WeightMatrix& w, size_t rows, size_t cols, const float* x, size_t n, float* y) {
  if (!w.quantized()) return MatMul(w, rows, cols, x, n, y);
  std::vector<float> rounded(x, x + n * cols);
  for (size_t r = 0; r < n; ++r) kernels::RoundThroughFp8(std::span(rounded).subspan(r * cols, cols), 128);
  MatMul(w, rows, cols, rounded.data(), n, y);
}

// Rows [row_begin, row_end) of `w` ([rows][cols], held on the host) as
// floats into out[row_end - row_begin][cols].
inline void WidenRows(const WeightMatrix& w, size_t cols, size_t row_begin, size_t row_end, float* out) {
  if (!w.bf16.empty()) {
    for (size_t i = row_begin * cols; i < row_end * cols; ++i) *out++ = kernels::Bf16ToFloat(w.bf16[i]);
  } else if (!w.fp8.empty()) {
    kernels::DequantizeFp8Rows(w.Fp8(), cols, row_begin, row_end, out);
  } else if (!w.fp4.empty()) {
    kernels::DequantizeFp4Rows(w.Fp4(), cols, row_begin, row_end, out);
  } else {
    std::copy(w.f32.begin() + row_begin * cols, w.f32.begin() + row_end * cols, out);
  }
}

// Values rounded to bf16, as the GPU's products take their weights.
inline std::vector<uint16_t> ToBf16(std::span<const float> x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = kernels::FloatToBf16(x[i]);
  return out;
}

// All of `w` ([*][cols], held on the host) as an accelerator holds it:
// widened, then rounded to bf16 (exact for bf16, MXFP4 and FP8 with
// power-of-two scales).
inline std::vector<uint16_t> WidenedBf16(const WeightMatrix& w, size_t cols) {
  std::vector<float> values(w.values());
  WidenRows(w, cols, 0, values.size() / cols, values.data());
  return ToBf16(values);
}

// Row `row` of `w` ([rows][cols]) as floats into out[cols].
inline void EmbeddingRow(const WeightMatrix& w, size_t row, size_t cols, float* out) {
  WidenRows(w, cols, row, row + 1, out);
}

// MatMul over rows [row_begin, row_begin + rows) of w ([*][cols]), x's rows
// `x_stride` apart and y's `y_stride` apart; w bf16, float32 or placed on
// an accelerator.
inline void MatMulRows(const WeightMatrix& w, size_t row_begin, size_t rows, size_t cols, const float* x, size_t n,
                       size_t x_stride, float* y, size_t y_stride) {
  if (w.device != nullptr) {
    w.device->Multiply(row_begin, rows, cols, x, n, x_stride, y, y_stride);
  } else if (!w.bf16.empty()) {
    kernels::GemmBf16(w.bf16.data() + row_begin * cols, rows, cols, x, n, x_stride, y, y_stride);
  } else {
    kernels::Gemm(w.f32.data() + row_begin * cols, rows, cols, x, n, x_stride, y, y_stride);
  }
}

// MatMul over float32 weights held as such (the MoE router).
inline void MatMul(const std::vector<float>& w, size_t rows, size_t cols, const float* x, size_t n, float* y) {
  kernels::Gemm(w.data(), rows, cols, x, n, cols, y, rows);
}

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_MATMUL_H_
