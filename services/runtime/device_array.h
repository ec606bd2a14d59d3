// Device memory for the CUDA backends (cuda_forward.h, cuda_accelerator.h):
// an array that only grows and is freed with its owner. Built only with
// CUDA.
#ifndef KVTIER_SERVICES_RUNTIME_DEVICE_ARRAY_H_
#define KVTIER_SERVICES_RUNTIME_DEVICE_ARRAY_H_

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kvtier/kernels/cuda_device.h"
#include "services/base/status.h"

namespace kvtier::runtime {

// Device memory for n values of T that only grows, freed with its owner.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(DeviceArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceArray& operator=(DeviceArray&&) = delete;
  ~DeviceArray() { kernels::cuda::DeviceFree(data_); }

  T* data() const { return data_; }

  // Room for n values; what was there is lost when it grows.
  absl::Status Reserve(size_t n) {
    if (n <= size_) return absl::OkStatus();
    if (data_ != nullptr) {
      // Queued work may still use it (freeing only "may" wait for that).
      KVTIER_RETURN_IF_ERROR(FromKernelStatus(kernels::cuda::DeviceSynchronize("growing a device array")));
      kernels::cuda::DeviceFree(data_);
    }
    data_ = nullptr, size_ = 0;
    void* allocated = nullptr;
    KVTIER_RETURN_IF_ERROR(FromKernelStatus(kernels::cuda::DeviceAllocate(n * sizeof(T), allocated, "device array")));
    data_ = static_cast<T*>(allocated);
    size_ = n;
    return absl::OkStatus();
  }

  // Reserve, then copy `host` in and return once it is staged (weights, at
  // load time): `host` may go.
  absl::Status Assign(std::span<const T> host) {
    KVTIER_RETURN_IF_ERROR(Reserve(std::max<size_t>(host.size(), 1)));
    return FromKernelStatus(
        kernels::cuda::CopyNow(data_, host.data(), host.size_bytes(), kernels::cuda::Copy::kHostToDevice, "upload"));
  }

  // Reserve, then queue a copy of `host` on `stream` (ordered before what
  // reads it there). `host` must stay until the stream has been waited for:
  // from pageable memory CUDA may stage it when the copy runs.
  absl::Status Upload(std::span<const T> host, kernels::cuda::StreamHandle stream) {
    KVTIER_RETURN_IF_ERROR(Reserve(std::max<size_t>(host.size(), 1)));
    return FromKernelStatus(kernels::cuda::CopyQueued(data_, host.data(), host.size_bytes(),
                                                      kernels::cuda::Copy::kHostToDevice, stream, "upload"));
  }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_DEVICE_ARRAY_H_
