// An Accelerator on the host that computes products in the precision
// --device cuda does (cuda_accelerator.cc, kernels/cuda/matmul.cu): the
// weights widened and rounded to bf16 once, each input row rounded to
// bf16, the products summed in float32; the indexer and attention as on
// the CPU (the GPU's run in float32 too). What is left between this and
// the GPU is the order of float32 sums. The CPU backend itself multiplies
// float32 inputs, and where a model rounds a product's result to FP8
// (V4's inputs of FP8 products, V3.2's indexer) the GPU's 2^-9 input
// rounding moves some values across an FP8 step: this, not the CPU, is
// the reference the GPU can be held to row by row.
#ifndef KVTIER_TESTS_RUNTIME_BF16_PRODUCTS_ACCELERATOR_H_
#define KVTIER_TESTS_RUNTIME_BF16_PRODUCTS_ACCELERATOR_H_

#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kvtier/kernels/float_formats.h"
#include "services/runtime/accelerator.h"
#include "services/runtime/matmul.h"

namespace kvtier::runtime {

class Bf16ProductsAccelerator final : public Accelerator {
 public:
  class Matrix final : public DeviceMatrix {
   public:
    Matrix(WeightMatrix bf16, bool quantized) : w_(std::move(bf16)), quantized_(quantized) {}
    void Multiply(size_t row_begin, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
                  size_t y_stride) const override {
      std::vector<float> rounded(n * cols);
      for (size_t i = 0; i < n; ++i) {
        for (size_t c = 0; c < cols; ++c) {
          rounded[i * cols + c] = kernels::Bf16ToFloat(kernels::FloatToBf16(x[i * x_stride + c]));
        }
      }
      MatMulRows(w_, row_begin, rows, cols, rounded.data(), n, cols, y, y_stride);
    }
    bool quantized() const override { return quantized_; }

   private:
    const WeightMatrix w_;  // bf16
    const bool quantized_;
  };

  absl::Status Place(WeightMatrix& w, size_t cols) override {
    if (cols == 0 || w.values() % cols != 0) return absl::InternalError("not whole rows");
    WeightMatrix bf16;
    bf16.bf16 = WidenedBf16(w, cols);  // as CudaAccelerator::Place holds it
    const bool quantized = w.quantized();
    w = WeightMatrix{};
    w.device = std::make_shared<Matrix>(std::move(bf16), quantized);
    return absl::OkStatus();
  }
  absl::Status TakeError() override { return absl::OkStatus(); }
  absl::Status ChooseKeys(const IndexerQueries& queries, std::vector<std::vector<uint32_t>>& chosen) override {
    ChooseKeysOnCpu(queries, chosen);
    return absl::OkStatus();
  }
  absl::Status SinkAttention(const kernels::SinkAttentionShape& shape, std::span<const std::vector<float>> entries,
                             const float* q, const float* sinks, float* out) override {
    SinkAttentionOnCpu(shape, entries, q, sinks, out);
    return absl::OkStatus();
  }
};

}  // namespace kvtier::runtime

#endif  // KVTIER_TESTS_RUNTIME_BF16_PRODUCTS_ACCELERATOR_H_
