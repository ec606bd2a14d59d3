// The device tier's slab of GPU memory (cuda_slab.h).
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>

#include "cuda_status.h"
#include "kvtier/kernels/cuda_slab.h"

namespace kvtier::kernels::cuda {

Status DeviceSlab::Create(uint64_t bytes, std::unique_ptr<DeviceSlab>& out) {
  std::unique_ptr<DeviceSlab> slab(new DeviceSlab());
  if (const cudaError_t e = cudaGetDevice(&slab->device_); e != cudaSuccess) return CudaError(e, "cudaGetDevice");
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, slab->device_);
  slab->name_ = "cuda:" + std::to_string(slab->device_) + " " + prop.name;
  void* base = nullptr;
  if (const cudaError_t e = cudaMalloc(&base, bytes); e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return Status(e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal,
                  "cudaMalloc of " + std::to_string(bytes) + " bytes on " + slab->name_ + ": " + cudaGetErrorString(e));
  }
  slab->base_ = static_cast<uint8_t*>(base);
  slab->size_ = bytes;
  cudaStream_t stream = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return CudaError(e, "cudaStreamCreate");
  }
  slab->stream_ = stream;
  out = std::move(slab);
  return OkStatus();
}

DeviceSlab::~DeviceSlab() {
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (base_ != nullptr) cudaFree(base_);
}

namespace {

Status CheckRange(uint64_t offset, size_t n, uint64_t size) {
  if (offset > size || n > size - offset) return Status(StatusCode::kInternal, "slab copy outside the slab");
  return OkStatus();
}

}  // namespace

Status DeviceSlab::Copy(void* to, const void* from, size_t n, int kind, const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  if (const cudaError_t e = cudaMemcpyAsync(to, from, n, static_cast<cudaMemcpyKind>(kind), stream); e != cudaSuccess) {
    return CudaError(e, what);
  }
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) return CudaError(e, what);
  return OkStatus();
}

Status DeviceSlab::CopyIn(uint64_t offset, const void* from, size_t n) {
  const SlabRun run{offset, n, const_cast<void*>(from)};  // read only: a copy in
  return CopyRuns({&run, 1}, true);
}

Status DeviceSlab::CopyOut(uint64_t offset, void* to, size_t n) {
  const SlabRun run{offset, n, to};
  return CopyRuns({&run, 1}, false);
}

namespace {

// Freed pinned buffers, kept for the next of the same size: cudaMallocHost
// of 1 MB costs about a millisecond (page locking), fifty times the copy a
// tier move or a Get from the device tier needs the buffer for.
class PinnedPool {
 public:
  static PinnedPool& Get() {
    static PinnedPool* pool = new PinnedPool();  // outlives every buffer
    return *pool;
  }
  uint8_t* Take(size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(n);
      if (it != free_.end()) {
        uint8_t* p = it->second;
        free_.erase(it);
        kept_ -= n;
        return p;
      }
    }
    void* p = nullptr;
    if (cudaMallocHost(&p, n) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return static_cast<uint8_t*>(p);
  }
  void Give(uint8_t* p, size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (kept_ + n <= kKeptBytes) {
        free_.emplace(n, p);
        kept_ += n;
        return;
      }
    }
    cudaFreeHost(p);
  }

 private:
  static constexpr size_t kKeptBytes = size_t{256} << 20;
  std::mutex mu_;
  std::multimap<size_t, uint8_t*> free_;
  size_t kept_ = 0;
};

}  // namespace

std::shared_ptr<uint8_t> DeviceSlab::AllocatePinned(size_t n) {
  uint8_t* p = PinnedPool::Get().Take(n);
  if (p == nullptr) {
    return std::shared_ptr<uint8_t>(new uint8_t[n], std::default_delete<uint8_t[]>());  // pageable, still correct
  }
  return std::shared_ptr<uint8_t>(p, [n](uint8_t* q) { PinnedPool::Get().Give(q, n); });
}

Status DeviceSlab::PinHost(void* p, size_t n) {
  if (const cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterDefault); e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return CudaError(e, "cudaHostRegister");
  }
  return OkStatus();
}

void DeviceSlab::UnpinHost(void* p) {
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

Status DeviceSlab::CopyRuns(std::span<const SlabRun> runs, bool in) {
  const char* what = in ? "slab copy in" : "slab copy out";
  for (const SlabRun& r : runs) {
    if (Status s = CheckRange(r.offset, r.n, size_); !s.ok()) return s;
  }
  std::lock_guard<std::mutex> lock(mu_);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  cudaError_t first = cudaSuccess;
  for (const SlabRun& r : runs) {
    const cudaError_t e = in ? cudaMemcpyAsync(base_ + r.offset, r.host, r.n, cudaMemcpyHostToDevice, stream)
                             : cudaMemcpyAsync(r.host, base_ + r.offset, r.n, cudaMemcpyDeviceToHost, stream);
    if (e != cudaSuccess) {
      first = e;
      break;  // what was queued is still waited for below
    }
  }
  const cudaError_t waited = cudaStreamSynchronize(stream);
  if (first != cudaSuccess) return CudaError(first, what);
  if (waited != cudaSuccess) return CudaError(waited, what);
  return OkStatus();
}

Status DeviceSlab::CopyInRuns(std::span<const SlabRun> runs) { return CopyRuns(runs, true); }

Status DeviceSlab::CopyOutRuns(std::span<const SlabRun> runs) { return CopyRuns(runs, false); }

Status DeviceSlab::CopyToDevice(uint64_t offset, void* device_to, size_t n) {
  if (Status s = CheckRange(offset, n, size_); !s.ok()) return s;
  return Copy(device_to, base_ + offset, n, cudaMemcpyDeviceToDevice, "slab copy to device");
}

}  // namespace kvtier::kernels::cuda
