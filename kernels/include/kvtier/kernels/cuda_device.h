// Device memory, copies and streams of the CUDA backend, for code outside
// kernels/ (the runtime's forward pass and its device block pool), which
// never includes <cuda_runtime.h>: a stream is an opaque handle here, as in
// the other cuda_*.h headers. Built only with CUDA. Thread-safe as CUDA's
// runtime is (one stream is used by one thread at a time).
#ifndef KVTIER_KERNELS_CUDA_DEVICE_H_
#define KVTIER_KERNELS_CUDA_DEVICE_H_

#include <cstddef>
#include <memory>

#include "kvtier/kernels/status.h"

namespace kvtier::kernels::cuda {

// A cudaStream_t; null is the default stream.
using StreamHandle = void*;

// A stream of its own, destroyed with this object.
class DeviceStream {
 public:
  static Status Create(std::unique_ptr<DeviceStream>& out);
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;

  StreamHandle handle() const { return stream_; }
  // Waits for everything queued on it; INTERNAL naming `what` on a fault.
  Status Synchronize(const char* what) const;

 private:
  explicit DeviceStream(StreamHandle stream) : stream_(stream) {}
  StreamHandle stream_;
};

// `bytes` of device memory in `out`: RESOURCE_EXHAUSTED when it does not
// fit, naming `what`.
Status DeviceAllocate(size_t bytes, void*& out, const char* what);
// Frees what DeviceAllocate gave (null: nothing). Queued work may still
// read it: call DeviceSynchronize first where it might.
void DeviceFree(void* p);
// Waits for all work on the device.
Status DeviceSynchronize(const char* what);
// Free and total bytes of the current device; false when unknown.
bool DeviceMemory(size_t& free, size_t& total);

enum class Copy { kHostToDevice, kDeviceToHost, kDeviceToDevice };
// A copy that returns when done (`host` may go then).
Status CopyNow(void* to, const void* from, size_t bytes, Copy kind, const char* what);
// Copies queued on `stream`: the source must stay until the stream has been
// waited for (from pageable memory CUDA may stage it when the copy runs).
Status CopyQueued(void* to, const void* from, size_t bytes, Copy kind, StreamHandle stream, const char* what);
// `rows` rows of `row_bytes`, `to_pitch` and `from_pitch` bytes apart.
Status Copy2DQueued(void* to, size_t to_pitch, const void* from, size_t from_pitch, size_t row_bytes, size_t rows,
                    Copy kind, StreamHandle stream, const char* what);
Status FillQueued(void* p, int byte, size_t bytes, StreamHandle stream, const char* what);

// Device-to-device copies of `bytes`, the mean of 10 after a first, in
// GB/s of bytes read plus written: the bandwidth the GPU's rates are set
// against. 0 when the memory cannot be had or a copy fails.
double DeviceCopyGBs(size_t bytes);

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_DEVICE_H_
