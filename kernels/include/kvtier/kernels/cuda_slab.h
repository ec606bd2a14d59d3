// One slab of GPU memory (cudaMalloc'd once) that the cache's device tier
// lives in, with its own stream for the copies in and out, so tier moves
// never wait behind other work on the device. Built only with CUDA;
// callable from plain C++. Thread-safe: copies are serialized on the stream.
#ifndef KVTIER_KERNELS_CUDA_SLAB_H_
#define KVTIER_KERNELS_CUDA_SLAB_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "kvtier/kernels/status.h"

namespace kvtier::kernels::cuda {

// One piece of a copy between the slab and host memory (plain C++: the
// cache's SlabMemory uses it without CUDA too).
struct SlabRun {
  uint64_t offset;  // in the slab
  size_t n;
  void* host;
};

class DeviceSlab {
 public:
  // `bytes` on the current device. RESOURCE_EXHAUSTED when it does not fit;
  // INTERNAL for other CUDA errors.
  static Status Create(uint64_t bytes, std::unique_ptr<DeviceSlab>& out);
  ~DeviceSlab();
  DeviceSlab(const DeviceSlab&) = delete;
  DeviceSlab& operator=(const DeviceSlab&) = delete;

  uint64_t size() const { return size_; }
  // "cuda:0 NVIDIA H200".
  const std::string& name() const { return name_; }

  // Copies between [offset, offset + n) of the slab and host memory, and
  // waits. From and to pinned memory (AllocatePinned) they run at the full
  // PCIe rate; pageable memory is staged by the driver.
  Status CopyIn(uint64_t offset, const void* from, size_t n);
  Status CopyOut(uint64_t offset, void* to, size_t n);
  // The same for several runs (a block's pages), queued together and waited
  // for once: a wait costs about as much as copying 0.5 MB.
  Status CopyInRuns(std::span<const SlabRun> runs);
  Status CopyOutRuns(std::span<const SlabRun> runs);
  // CopyInRuns without the wait: the bytes are copied into pinned staging
  // of the slab's own first (reused once the copies from it have landed),
  // so the sources may be reused at once; later copies on the slab's
  // stream see them (an error may surface at one of those). Batches over
  // a staging chunk (4 MB) wait instead.
  Status CopyInRunsNoWait(std::span<const SlabRun> runs);
  // A record in the slab, for CopyOutRunsWithCrc: its pages' offsets in
  // the slab, in order, and how many of its first bytes to check.
  struct Record {
    std::span<const uint64_t> page_offsets;
    uint64_t bytes;
  };
  // CopyOutRuns, the CRC32C of each record's first `bytes` bytes computed
  // on the GPU first (chunks of 256 bytes a thread, joined with
  // crc32c_math.h's algebra) into crcs[k], on the same stream, one wait
  // for all: the host need not read the copies to check them. Pages are
  // `page_size` bytes, a power of two of at least kMinCrcPage, and the
  // records' page offsets multiples of it.
  static constexpr uint32_t kMinCrcPage = 256;
  static constexpr bool ChecksPagesOf(uint32_t page_size) {
    return page_size >= kMinCrcPage && (page_size & (page_size - 1)) == 0;
  }
  Status CopyOutRunsWithCrc(std::span<const SlabRun> runs, std::span<const Record> records, uint32_t page_size,
                            uint32_t* crcs);
  // Copies runs of the slab to other device memory (a DeviceBuffer's):
  // here each run's `host` is that device memory. Queued together on the
  // slab's stream, waited for once (a record's pages are many runs).
  Status CopyToDeviceRuns(std::span<const SlabRun> runs);
  // Page-locked host memory, given back when the last owner lets go (kept,
  // up to 256 MB, for the next buffer of its size).
  static std::shared_ptr<uint8_t> AllocatePinned(size_t n);
  // Page-locks host memory this process already maps (cudaHostRegister),
  // so copies to and from it run at the pinned rate; UnpinHost before the
  // memory is unmapped or remapped. INTERNAL when the driver refuses.
  static Status PinHost(void* p, size_t n);
  static void UnpinHost(void* p);
  int device() const { return device_; }

 private:
  DeviceSlab() = default;
  // A cudaMemcpyAsync per run (slab to host, or host to slab), one wait.
  Status CopyRuns(std::span<const SlabRun> runs, bool in);
  // A staging chunk for CopyInRunsNoWait with room for `bytes`: the next
  // one when the current is full, after the copies out of it have landed.
  // Null when pinned memory cannot be had. Under mu_.
  uint8_t* StagingFor(size_t bytes);
  static constexpr size_t kStagingChunkBytes = size_t{4} << 20;
  static constexpr size_t kStagingChunks = 4;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  std::array<uint8_t*, kStagingChunks> staging_{};    // cudaMallocHost'd when first needed
  std::array<void*, kStagingChunks> staging_done_{};  // cudaEvent_t: the last copy out of each chunk
  size_t staging_chunk_ = 0, staging_used_ = 0;
  int device_ = 0;
  void* stream_ = nullptr;  // cudaStream_t
  std::string name_;
  std::mutex mu_;  // one caller queuing on the stream at a time (waits are outside it)
};

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_SLAB_H_
