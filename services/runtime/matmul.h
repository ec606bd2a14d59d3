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

// A projection's weights [rows][cols]: a bf16 checkpoint's stay bf16 (half
// the memory, and half the bytes a decode step reads), other dtypes become
// float32. One of the two is filled. Products are the same bits either way:
// a bf16 widens to float exactly.
struct WeightMatrix {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;

  size_t bytes() const { return f32.size() * sizeof(float) + bf16.size() * sizeof(uint16_t); }
};

// A checkpoint tensor as a WeightMatrix (its bf16 copied as it is).
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
  } else {
    kernels::Gemm(w.f32.data(), rows, cols, x, n, cols, y, rows);
  }
}

// Row `row` of `w` ([rows][cols]) as floats into out[cols].
inline void EmbeddingRow(const WeightMatrix& w, size_t row, size_t cols, float* out) {
  if (!w.bf16.empty()) {
    for (size_t c = 0; c < cols; ++c) out[c] = kernels::Bf16ToFloat(w.bf16[row * cols + c]);
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
