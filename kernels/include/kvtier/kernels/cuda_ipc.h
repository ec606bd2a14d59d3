// GPU memory shared between processes on one host (CUDA IPC), for the
// cache's same-host fast path to GPU clients: the cache copies leased
// blocks device-to-device into a per-session DeviceBuffer, whose handle only
// that session receives; the client opens the handle (IpcMapping) and
// copies out of it. Built only with CUDA; callable from plain C++.
#ifndef KVTIER_KERNELS_CUDA_IPC_H_
#define KVTIER_KERNELS_CUDA_IPC_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvtier/kernels/status.h"

namespace kvtier::kernels::cuda {

using IpcHandleBytes = std::array<char, 64>;  // a cudaIpcMemHandle_t

// One cudaMalloc'd buffer on the current device that other processes may
// open. Not thread-safe.
class DeviceBuffer {
 public:
  static Status Create(uint64_t bytes, std::unique_ptr<DeviceBuffer>& out);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const IpcHandleBytes& handle() const { return handle_; }

 private:
  DeviceBuffer() = default;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  IpcHandleBytes handle_{};
};

// Another process's DeviceBuffer, opened from its handle. Not thread-safe.
class IpcMapping {
 public:
  // INTERNAL when the handle does not open here (another host, no GPU, or
  // the exporter is gone); `bytes` is the buffer's size, as its owner said.
  static Status Open(const IpcHandleBytes& handle, uint64_t bytes, std::unique_ptr<IpcMapping>& out);
  ~IpcMapping();
  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;

  uint64_t size() const { return size_; }
  // Copies [offset, offset + n) to host memory and waits.
  Status CopyToHost(uint64_t offset, void* to, size_t n) const;

 private:
  IpcMapping() = default;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_IPC_H_
