#include "services/runtime/cuda_products.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvtier/kernels/cuda_codec.h"
#include "kvtier/kernels/cuda_device.h"
#include "kvtier/kernels/cuda_matmul.h"
#include "services/base/status.h"
#include "services/runtime/device_array.h"

namespace kvtier::runtime {
namespace {

namespace kc = kernels::cuda;

absl::Status Check(const kernels::Status& s) { return FromKernelStatus(s); }

class CudaProducts final : public ProductDevice {
 public:
  absl::Status Open();
  absl::Status Place(WeightMatrix& w, size_t cols) override;
  absl::Status TakeError() override;
  // DeviceMatrix::Multiply over `weights` (bf16 [*][cols] on the device).
  void Multiply(const uint16_t* weights, size_t row_begin, size_t rows, size_t cols, const float* x, size_t n,
                size_t x_stride, float* y, size_t y_stride);

 private:
  absl::Status MultiplyLocked(const uint16_t* weights, size_t row_begin, size_t rows, size_t cols, const float* x,
                              size_t n, size_t x_stride, float* y, size_t y_stride)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<kc::DeviceStream> stream_;
  std::unique_ptr<kc::Blas> blas_;  // on stream_
  absl::Mutex mu_;
  DeviceArray<float> x_ ABSL_GUARDED_BY(mu_), y_ ABSL_GUARDED_BY(mu_);
  std::vector<float> packed_x_ ABSL_GUARDED_BY(mu_), packed_y_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

class CudaMatrix final : public DeviceMatrix {
 public:
  CudaMatrix(CudaProducts* device, DeviceArray<uint16_t> weights, bool quantized)
      : device_(device), weights_(std::move(weights)), quantized_(quantized) {}

  void Multiply(size_t row_begin, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
                size_t y_stride) const override {
    device_->Multiply(weights_.data(), row_begin, rows, cols, x, n, x_stride, y, y_stride);
  }
  bool quantized() const override { return quantized_; }

 private:
  CudaProducts* const device_;  // outlives the matrices placed on it
  const DeviceArray<uint16_t> weights_;
  const bool quantized_;
};

absl::Status CudaProducts::Open() {
  std::string why;
  if (!kc::DevicePresent(&why)) return absl::FailedPreconditionError(absl::StrCat("--device cuda: no usable GPU: ", why));
  KVTIER_RETURN_IF_ERROR(Check(kc::DeviceStream::Create(stream_)));
  return Check(kc::Blas::Create(stream_->handle(), blas_));
}

absl::Status CudaProducts::Place(WeightMatrix& w, size_t cols) {
  const size_t elements = w.bf16.size() + w.f32.size() + w.fp8.size() + 2 * w.fp4.size();
  if (cols == 0 || elements % cols != 0) {
    return absl::InternalError(absl::StrCat("a weight matrix of ", elements, " values is not rows of ", cols));
  }
  const size_t rows = elements / cols;
  std::vector<uint16_t> bf16 = std::move(w.bf16);
  if (bf16.empty()) {
    std::vector<float> values = std::move(w.f32);
    if (!w.fp8.empty()) {
      values.resize(elements);
      kernels::DequantizeFp8Rows(w.Fp8(), cols, 0, rows, values.data());
    } else if (!w.fp4.empty()) {
      values.resize(elements);
      kernels::DequantizeFp4Rows(w.Fp4(), cols, 0, rows, values.data());
    }
    bf16 = ToBf16(values);
  }
  DeviceArray<uint16_t> on_device;
  KVTIER_RETURN_IF_ERROR(on_device.Assign(bf16));
  const bool quantized = w.quantized();
  w = WeightMatrix{};
  w.device = std::make_shared<CudaMatrix>(this, std::move(on_device), quantized);
  return absl::OkStatus();
}

absl::Status CudaProducts::TakeError() {
  absl::MutexLock lock(&mu_);
  return std::exchange(error_, absl::OkStatus());
}

void CudaProducts::Multiply(const uint16_t* weights, size_t row_begin, size_t rows, size_t cols, const float* x,
                            size_t n, size_t x_stride, float* y, size_t y_stride) {
  absl::MutexLock lock(&mu_);
  const absl::Status done = MultiplyLocked(weights, row_begin, rows, cols, x, n, x_stride, y, y_stride);
  if (done.ok()) return;
  for (size_t i = 0; i < n; ++i) std::fill_n(y + i * y_stride, rows, NAN);
  if (error_.ok()) error_ = done;
}

absl::Status CudaProducts::MultiplyLocked(const uint16_t* weights, size_t row_begin, size_t rows, size_t cols,
                                          const float* x, size_t n, size_t x_stride, float* y, size_t y_stride) {
  if (n == 0) return absl::OkStatus();
  // cuBLAS takes whole rows: strided inputs and outputs go through packed
  // host copies.
  const float* in = x;
  if (x_stride != cols) {
    packed_x_.resize(n * cols);
    for (size_t i = 0; i < n; ++i) std::copy_n(x + i * x_stride, cols, packed_x_.data() + i * cols);
    in = packed_x_.data();
  }
  float* out = y;
  if (y_stride != rows) {
    packed_y_.resize(n * rows);
    out = packed_y_.data();
  }
  KVTIER_RETURN_IF_ERROR(y_.Reserve(n * rows));
  KVTIER_RETURN_IF_ERROR(x_.Upload(std::span(in, n * cols), stream_->handle()));
  KVTIER_RETURN_IF_ERROR(Check(blas_->Gemm(weights + row_begin * cols, static_cast<uint32_t>(rows),
                                           static_cast<uint32_t>(cols), x_.data(), static_cast<uint32_t>(n), y_.data())));
  KVTIER_RETURN_IF_ERROR(Check(
      kc::CopyQueued(out, y_.data(), n * rows * sizeof(float), kc::Copy::kDeviceToHost, stream_->handle(), "product")));
  KVTIER_RETURN_IF_ERROR(Check(stream_->Synchronize("a product's download (or work queued before it)")));
  if (out != y) {
    for (size_t i = 0; i < n; ++i) std::copy_n(out + i * rows, rows, y + i * y_stride);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProductDevice>> NewCudaProductDevice() {
  auto device = std::make_unique<CudaProducts>();
  KVTIER_RETURN_IF_ERROR(device->Open());
  return device;
}

}  // namespace kvtier::runtime
