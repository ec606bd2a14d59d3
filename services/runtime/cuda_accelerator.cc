#include "services/runtime/cuda_accelerator.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvtier/kernels/cuda_codec.h"
#include "kvtier/kernels/cuda_device.h"
#include "kvtier/kernels/cuda_matmul.h"
#include "kvtier/kernels/cuda_sparse_mla.h"
#include "kvtier/kernels/cuda_v4_attention.h"
#include "services/base/status.h"
#include "services/runtime/device_array.h"

namespace kvtier::runtime {
namespace {

namespace kc = kernels::cuda;

absl::Status Check(const kernels::Status& s) { return FromKernelStatus(s); }

class CudaAccelerator final : public Accelerator {
 public:
  absl::Status Open();
  absl::Status Place(WeightMatrix& w, size_t cols) override;
  absl::Status TakeError() override;
  absl::Status ChooseKeys(const IndexerQueries& queries, std::vector<std::vector<uint32_t>>& chosen) override;
  absl::Status SinkAttention(const kernels::SinkAttentionShape& shape, std::span<const std::vector<float>> entries,
                             const float* q, const float* sinks, float* out) override;
  // DeviceMatrix::Multiply over `weights` (bf16 [*][cols] on the device).
  void Multiply(const uint16_t* weights, size_t row_begin, size_t rows, size_t cols, const float* x, size_t n,
                size_t x_stride, float* y, size_t y_stride);

 private:
  absl::Status MultiplyLocked(const uint16_t* weights, size_t row_begin, size_t rows, size_t cols, const float* x,
                              size_t n, size_t x_stride, float* y, size_t y_stride) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<kc::DeviceStream> stream_;
  std::unique_ptr<kc::Blas> blas_;  // on stream_
  absl::Mutex mu_;
  DeviceArray<float> x_ ABSL_GUARDED_BY(mu_), y_ ABSL_GUARDED_BY(mu_);
  // The indexer's and attention's inputs and scratch.
  DeviceArray<float> index_q_ ABSL_GUARDED_BY(mu_), index_weights_ ABSL_GUARDED_BY(mu_), keys_ ABSL_GUARDED_BY(mu_),
      index_scores_ ABSL_GUARDED_BY(mu_);
  DeviceArray<int64_t> key_offsets_ ABSL_GUARDED_BY(mu_);
  DeviceArray<int32_t> visible_ ABSL_GUARDED_BY(mu_), selected_ ABSL_GUARDED_BY(mu_),
      selected_counts_ ABSL_GUARDED_BY(mu_);
  std::vector<float> packed_keys_ ABSL_GUARDED_BY(mu_);
  DeviceArray<float> q_ ABSL_GUARDED_BY(mu_), entries_ ABSL_GUARDED_BY(mu_), sinks_ ABSL_GUARDED_BY(mu_),
      scores_ ABSL_GUARDED_BY(mu_), attended_ ABSL_GUARDED_BY(mu_);
  DeviceArray<int64_t> offsets_ ABSL_GUARDED_BY(mu_);
  DeviceArray<int32_t> counts_ ABSL_GUARDED_BY(mu_);
  std::vector<float> packed_entries_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

class CudaMatrix final : public DeviceMatrix {
 public:
  CudaMatrix(CudaAccelerator* device, DeviceArray<uint16_t> weights, bool quantized)
      : device_(device), weights_(std::move(weights)), quantized_(quantized) {}

  void Multiply(size_t row_begin, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
                size_t y_stride) const override {
    device_->Multiply(weights_.data(), row_begin, rows, cols, x, n, x_stride, y, y_stride);
  }
  bool quantized() const override { return quantized_; }

 private:
  CudaAccelerator* const device_;  // outlives the matrices placed on it
  const DeviceArray<uint16_t> weights_;
  const bool quantized_;
};

absl::Status CudaAccelerator::Open() {
  std::string why;
  if (!kc::DevicePresent(&why))
    return absl::FailedPreconditionError(absl::StrCat("--device cuda: no usable GPU: ", why));
  KVTIER_RETURN_IF_ERROR(Check(kc::DeviceStream::Create(stream_)));
  return Check(kc::Blas::Create(stream_->handle(), blas_));
}

absl::Status CudaAccelerator::Place(WeightMatrix& w, size_t cols) {
  if (cols == 0 || w.values() % cols != 0) {
    return absl::InternalError(absl::StrCat("a weight matrix of ", w.values(), " values is not rows of ", cols));
  }
  DeviceArray<uint16_t> on_device;
  KVTIER_RETURN_IF_ERROR(on_device.Assign(WidenedBf16(w, cols)));
  const bool quantized = w.quantized();
  w = WeightMatrix{};
  w.device = std::make_shared<CudaMatrix>(this, std::move(on_device), quantized);
  return absl::OkStatus();
}

absl::Status CudaAccelerator::TakeError() {
  absl::MutexLock lock(&mu_);
  return std::exchange(error_, absl::OkStatus());
}

absl::Status CudaAccelerator::ChooseKeys(const IndexerQueries& queries, std::vector<std::vector<uint32_t>>& chosen) {
  const size_t rows = queries.visible.size(), dim = queries.dim, k = queries.k;
  chosen.assign(rows, {});
  const uint32_t most = rows == 0 ? 0 : *std::max_element(queries.visible.begin(), queries.visible.end());
  if (most == 0 || k == 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  // Each sequence's keys once: the rows of a sequence share them.
  std::vector<int64_t> offsets(rows);
  std::vector<int32_t> visible(rows);
  std::unordered_map<const float*, int64_t> placed;
  packed_keys_.clear();
  for (size_t r = 0; r < rows; ++r) {
    const auto [at, fresh] =
        placed.try_emplace(queries.keys[r].data(), static_cast<int64_t>(packed_keys_.size() / dim));
    if (fresh) packed_keys_.insert(packed_keys_.end(), queries.keys[r].begin(), queries.keys[r].end());
    offsets[r] = at->second;
    visible[r] = static_cast<int32_t>(queries.visible[r]);
  }
  const kc::StreamHandle stream = stream_->handle();
  KVTIER_RETURN_IF_ERROR(index_q_.Upload(std::span(queries.q, rows * queries.heads * dim), stream));
  KVTIER_RETURN_IF_ERROR(index_weights_.Upload(std::span(queries.weights, rows * queries.heads), stream));
  KVTIER_RETURN_IF_ERROR(keys_.Upload(std::span<const float>(packed_keys_), stream));
  KVTIER_RETURN_IF_ERROR(key_offsets_.Upload(std::span<const int64_t>(offsets), stream));
  KVTIER_RETURN_IF_ERROR(visible_.Upload(std::span<const int32_t>(visible), stream));
  KVTIER_RETURN_IF_ERROR(index_scores_.Reserve(rows * most));
  KVTIER_RETURN_IF_ERROR(selected_.Reserve(rows * k));
  KVTIER_RETURN_IF_ERROR(selected_counts_.Reserve(rows));
  KVTIER_RETURN_IF_ERROR(Check(kc::V4IndexerScores(
      queries.heads, queries.dim, static_cast<uint32_t>(rows), index_q_.data(), index_weights_.data(), keys_.data(),
      key_offsets_.data(), visible_.data(), most, index_scores_.data(), stream)));
  KVTIER_RETURN_IF_ERROR(
      Check(kc::SelectTopTokens(static_cast<uint32_t>(rows), index_scores_.data(), most, visible_.data(),
                                static_cast<uint32_t>(k), selected_.data(), selected_counts_.data(), stream)));
  std::vector<int32_t> selected(rows * k), counts(rows);
  KVTIER_RETURN_IF_ERROR(Check(kc::CopyQueued(selected.data(), selected_.data(), selected.size() * sizeof(int32_t),
                                              kc::Copy::kDeviceToHost, stream, "chosen keys")));
  KVTIER_RETURN_IF_ERROR(Check(kc::CopyQueued(counts.data(), selected_counts_.data(), counts.size() * sizeof(int32_t),
                                              kc::Copy::kDeviceToHost, stream, "chosen key counts")));
  KVTIER_RETURN_IF_ERROR(Check(stream_->Synchronize("the indexer's choice (or work queued before it)")));
  for (size_t r = 0; r < rows; ++r) {
    if (counts[r] < 0 || static_cast<size_t>(counts[r]) > std::min<size_t>(k, queries.visible[r])) {
      return absl::InternalError(absl::StrCat("the GPU's indexer chose ", counts[r], " keys of ", queries.visible[r]));
    }
    chosen[r].assign(selected.begin() + r * k, selected.begin() + r * k + counts[r]);
  }
  return absl::OkStatus();
}

absl::Status CudaAccelerator::SinkAttention(const kernels::SinkAttentionShape& shape,
                                            std::span<const std::vector<float>> entries, const float* q,
                                            const float* sinks, float* out) {
  const size_t rows = entries.size(), dim = shape.dim, outputs = rows * shape.heads * dim;
  if (rows == 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  // Every row's entries one after another.
  std::vector<int64_t> offsets(rows);
  std::vector<int32_t> counts(rows);
  size_t total = 0, most = 0;
  for (size_t r = 0; r < rows; ++r) {
    offsets[r] = static_cast<int64_t>(total);
    counts[r] = static_cast<int32_t>(entries[r].size() / dim);
    total += entries[r].size() / dim;
    most = std::max(most, entries[r].size() / dim);
  }
  packed_entries_.resize(std::max<size_t>(total, 1) * dim);
  for (size_t r = 0; r < rows; ++r)
    std::copy(entries[r].begin(), entries[r].end(), packed_entries_.begin() + offsets[r] * dim);
  const kc::StreamHandle stream = stream_->handle();
  KVTIER_RETURN_IF_ERROR(q_.Upload(std::span(q, outputs), stream));
  KVTIER_RETURN_IF_ERROR(entries_.Upload(std::span<const float>(packed_entries_), stream));
  KVTIER_RETURN_IF_ERROR(sinks_.Upload(std::span(sinks, shape.heads), stream));
  KVTIER_RETURN_IF_ERROR(offsets_.Upload(std::span<const int64_t>(offsets), stream));
  KVTIER_RETURN_IF_ERROR(counts_.Upload(std::span<const int32_t>(counts), stream));
  KVTIER_RETURN_IF_ERROR(scores_.Reserve(std::max<size_t>(rows * shape.heads * most, 1)));
  KVTIER_RETURN_IF_ERROR(attended_.Reserve(outputs));
  KVTIER_RETURN_IF_ERROR(Check(kc::SinkAttention(shape, static_cast<uint32_t>(rows), q_.data(), entries_.data(),
                                                 offsets_.data(), counts_.data(), static_cast<uint32_t>(most),
                                                 sinks_.data(), scores_.data(), attended_.data(), stream)));
  KVTIER_RETURN_IF_ERROR(Check(
      kc::CopyQueued(out, attended_.data(), outputs * sizeof(float), kc::Copy::kDeviceToHost, stream, "attention")));
  return Check(stream_->Synchronize("attention's download (or work queued before it)"));
}

void CudaAccelerator::Multiply(const uint16_t* weights, size_t row_begin, size_t rows, size_t cols, const float* x,
                               size_t n, size_t x_stride, float* y, size_t y_stride) {
  absl::MutexLock lock(&mu_);
  const absl::Status done = MultiplyLocked(weights, row_begin, rows, cols, x, n, x_stride, y, y_stride);
  if (done.ok()) return;
  for (size_t i = 0; i < n; ++i) std::fill_n(y + i * y_stride, rows, NAN);
  if (error_.ok()) error_ = done;
}

absl::Status CudaAccelerator::MultiplyLocked(const uint16_t* weights, size_t row_begin, size_t rows, size_t cols,
                                             const float* x, size_t n, size_t x_stride, float* y, size_t y_stride) {
  if (n == 0) return absl::OkStatus();
  // Strided rows in and out as 2D copies: cuBLAS gets them whole on the device.
  const kc::StreamHandle stream = stream_->handle();
  KVTIER_RETURN_IF_ERROR(x_.Reserve(n * cols));
  KVTIER_RETURN_IF_ERROR(y_.Reserve(n * rows));
  KVTIER_RETURN_IF_ERROR(
      Check(kc::Copy2DQueued(x_.data(), cols * sizeof(float), x, x_stride * sizeof(float), cols * sizeof(float), n,
                             kc::Copy::kHostToDevice, stream, "product inputs")));
  KVTIER_RETURN_IF_ERROR(
      Check(blas_->Gemm(weights + row_begin * cols, static_cast<uint32_t>(rows), static_cast<uint32_t>(cols), x_.data(),
                        static_cast<uint32_t>(n), y_.data())));
  KVTIER_RETURN_IF_ERROR(
      Check(kc::Copy2DQueued(y, y_stride * sizeof(float), y_.data(), rows * sizeof(float), rows * sizeof(float), n,
                             kc::Copy::kDeviceToHost, stream, "product outputs")));
  return Check(stream_->Synchronize("a product's download (or work queued before it)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Accelerator>> NewCudaAccelerator() {
  auto device = std::make_unique<CudaAccelerator>();
  KVTIER_RETURN_IF_ERROR(device->Open());
  return device;
}

}  // namespace kvtier::runtime
