// Weights kept as the checkpoint stores them, and the two ways the CPU
// runtime reads them: row-major products and single rows (embeddings).
#ifndef KVTIER_SERVICES_RUNTIME_MATMUL_H_
#define KVTIER_SERVICES_RUNTIME_MATMUL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/layers.h"
#include "services/runtime/safetensors.h"

namespace kvtier::runtime {

// A projection's weights [rows][cols] as the checkpoint stores them: bf16
// stays bf16 (half the memory, and half the bytes a decode step reads),
// block-scaled FP8 stays FP8 with its scales (a quarter), other dtypes
// become float32. One of the three is filled. Products are the same bits
// as over the weights widened to float32 first.
struct WeightMatrix {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> fp8;       // E4M3 codes
  std::vector<float> fp8_scales;  // [ceil(rows / block_rows)][ceil(cols / block_cols)]
  size_t fp8_block_rows = 0, fp8_block_cols = 0;

  size_t bytes() const {
    return f32.size() * sizeof(float) + bf16.size() * sizeof(uint16_t) + fp8.size() + fp8_scales.size() * sizeof(float);
  }
  kernels::Fp8BlockScaled Fp8() const { return {fp8.data(), fp8_scales.data(), fp8_block_rows, fp8_block_cols}; }
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
  if (!w.bf16.empty()) {
    kernels::GemmBf16(w.bf16.data(), rows, cols, x, n, cols, y, rows);
  } else if (!w.fp8.empty()) {
    kernels::GemmFp8(w.Fp8(), rows, cols, x, n, cols, y, rows);
  } else {
    kernels::Gemm(w.f32.data(), rows, cols, x, n, cols, y, rows);
  }
}

// Row `row` of `w` ([rows][cols]) as floats into out[cols].
inline void EmbeddingRow(const WeightMatrix& w, size_t row, size_t cols, float* out) {
  if (!w.bf16.empty()) {
    for (size_t c = 0; c < cols; ++c) out[c] = kernels::Bf16ToFloat(w.bf16[row * cols + c]);
  } else if (!w.fp8.empty()) {
    kernels::DequantizeFp8Rows(w.Fp8(), cols, row, row + 1, out);
  } else {
    std::copy_n(w.f32.begin() + row * cols, cols, out);
  }
}

// MatMul over float32 weights held as such (the MoE router).
inline void MatMul(const std::vector<float>& w, size_t rows, size_t cols, const float* x, size_t n, float* y) {
  kernels::Gemm(w.data(), rows, cols, x, n, cols, y, rows);
}

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_MATMUL_H_
