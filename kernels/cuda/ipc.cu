// CUDA IPC buffers and mappings (cuda_ipc.h).
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "cuda_status.h"
#include "kvtier/kernels/cuda_ipc.h"

namespace kvtier::kernels::cuda {

Status DeviceBuffer::Create(uint64_t bytes, std::unique_ptr<DeviceBuffer>& out) {
  std::unique_ptr<DeviceBuffer> buffer(new DeviceBuffer());
  void* p = nullptr;
  if (const cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
    cudaGetLastError();
    return Status(e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal,
                  std::string("cudaMalloc of an IPC buffer: ") + cudaGetErrorString(e));
  }
  buffer->data_ = static_cast<uint8_t*>(p);
  buffer->size_ = bytes;
  cudaIpcMemHandle_t handle;
  static_assert(sizeof handle == sizeof(IpcHandleBytes), "cudaIpcMemHandle_t is 64 bytes");
  if (const cudaError_t e = cudaIpcGetMemHandle(&handle, p); e != cudaSuccess)
    return CudaError(e, "cudaIpcGetMemHandle");
  std::memcpy(buffer->handle_.data(), &handle, sizeof handle);
  out = std::move(buffer);
  return OkStatus();
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

Status IpcMapping::Open(const IpcHandleBytes& bytes_of_handle, uint64_t bytes, std::unique_ptr<IpcMapping>& out) {
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, bytes_of_handle.data(), sizeof handle);
  void* p = nullptr;
  if (const cudaError_t e = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
    cudaGetLastError();
    return CudaError(e, "cudaIpcOpenMemHandle");
  }
  std::unique_ptr<IpcMapping> mapping(new IpcMapping());
  mapping->data_ = static_cast<uint8_t*>(p);
  mapping->size_ = bytes;
  out = std::move(mapping);
  return OkStatus();
}

IpcMapping::~IpcMapping() {
  if (data_ != nullptr) cudaIpcCloseMemHandle(data_);
}

Status IpcMapping::CopyToHost(uint64_t offset, void* to, size_t n) const {
  if (offset > size_ || n > size_ - offset) return Status(StatusCode::kInternal, "IPC copy outside the buffer");
  if (const cudaError_t e = cudaMemcpy(to, data_ + offset, n, cudaMemcpyDeviceToHost); e != cudaSuccess) {
    return CudaError(e, "IPC copy to host");
  }
  return OkStatus();
}

}  // namespace kvtier::kernels::cuda
