#include <cuda_runtime.h>

#include <chrono>

#include "cuda_status.h"
#include "kvtier/kernels/cuda_device.h"

namespace kvtier::kernels::cuda {
namespace {

cudaMemcpyKind Kind(Copy kind) {
  switch (kind) {
    case Copy::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case Copy::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case Copy::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

Status Checked(cudaError_t e, const char* what) { return e == cudaSuccess ? Status() : CudaError(e, what); }

cudaStream_t Stream(StreamHandle s) { return static_cast<cudaStream_t>(s); }

}  // namespace

Status DeviceStream::Create(std::unique_ptr<DeviceStream>& out) {
  cudaStream_t stream = nullptr;
  KVTIER_KERNELS_RETURN_IF_ERROR(Checked(cudaStreamCreate(&stream), "cudaStreamCreate"));
  out.reset(new DeviceStream(stream));
  return Status();
}

DeviceStream::~DeviceStream() { cudaStreamDestroy(Stream(stream_)); }

Status DeviceStream::Synchronize(const char* what) const {
  return Checked(cudaStreamSynchronize(Stream(stream_)), what);
}

Status DeviceAllocate(size_t bytes, void*& out, const char* what) {
  if (const cudaError_t e = cudaMalloc(&out, bytes); e != cudaSuccess) {
    out = nullptr;
    return Status(e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal,
                  std::string(what) + ": " + cudaGetErrorString(e));
  }
  return Status();
}

void DeviceFree(void* p) {
  if (p != nullptr) cudaFree(p);
}

Status DeviceSynchronize(const char* what) { return Checked(cudaDeviceSynchronize(), what); }

bool DeviceMemory(size_t& free, size_t& total) { return cudaMemGetInfo(&free, &total) == cudaSuccess; }

Status CopyNow(void* to, const void* from, size_t bytes, Copy kind, const char* what) {
  return Checked(cudaMemcpy(to, from, bytes, Kind(kind)), what);
}

Status CopyQueued(void* to, const void* from, size_t bytes, Copy kind, StreamHandle stream, const char* what) {
  return Checked(cudaMemcpyAsync(to, from, bytes, Kind(kind), Stream(stream)), what);
}

Status Copy2DQueued(void* to, size_t to_pitch, const void* from, size_t from_pitch, size_t row_bytes, size_t rows,
                    Copy kind, StreamHandle stream, const char* what) {
  return Checked(cudaMemcpy2DAsync(to, to_pitch, from, from_pitch, row_bytes, rows, Kind(kind), Stream(stream)), what);
}

Status FillQueued(void* p, int byte, size_t bytes, StreamHandle stream, const char* what) {
  return Checked(cudaMemsetAsync(p, byte, bytes, Stream(stream)), what);
}

double DeviceCopyGBs(size_t bytes) {
  constexpr int kReps = 10;
  void *from = nullptr, *to = nullptr;
  double gbs = 0;
  if (cudaMalloc(&from, bytes) == cudaSuccess && cudaMalloc(&to, bytes) == cudaSuccess &&
      cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice) == cudaSuccess &&
      cudaDeviceSynchronize() == cudaSuccess) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kReps; ++i) cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice);
    if (cudaDeviceSynchronize() == cudaSuccess) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      gbs = 2.0 * bytes * kReps / seconds / 1e9;
    }
  }
  cudaFree(from);
  cudaFree(to);
  return gbs;
}

}  // namespace kvtier::kernels::cuda
