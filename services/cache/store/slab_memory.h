// Memory a page tier can live in that this process does not address
// directly — a GPU's — reached by copies in and out. The device tier uses
// it when the cache runs on a GPU (CudaSlab); StagedHostSlab is the same
// contract over host memory, so every path through it runs without one.
#ifndef KVTIER_SERVICES_CACHE_STORE_SLAB_MEMORY_H_
#define KVTIER_SERVICES_CACHE_STORE_SLAB_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/kernels/cuda_slab.h"

namespace kvtier::cache {

// Device memory another process on this host can open (CUDA IPC): a fast
// path session's staging for GPU clients. Not thread-safe.
class ExportedBuffer {
 public:
  virtual ~ExportedBuffer() = default;
  virtual uint64_t size() const = 0;
  // What the other process opens it with (a cudaIpcMemHandle_t's 64 bytes).
  virtual std::string handle() const = 0;
};

// One piece of a copy between a slab and host memory (a page's run): the
// GPU slab's own type (plain C++), so runs go to it as they are.
using SlabRun = kernels::cuda::SlabRun;

// One piece of a copy from a slab into an ExportedBuffer (a page's run).
struct ExportRun {
  uint64_t offset;     // in the slab
  uint64_t to_offset;  // in the buffer
  size_t n;
};

// A record lying in a slab's pages, for SlabMemory::CopyOutRunsWithCrc.
struct SlabRecord {
  std::vector<uint64_t> page_offsets;  // its pages' offsets in the slab, in order
  uint64_t bytes = 0;                  // how many of its first bytes to check
};

// Thread-safe: copies to disjoint ranges may run at once.
class SlabMemory {
 public:
  virtual ~SlabMemory() = default;
  virtual uint64_t size() const = 0;
  // What it is, for logs and Stats ("cuda:0 NVIDIA H200", "host (staged)").
  virtual std::string name() const = 0;
  // Copies between [offset, offset + n) of the slab and host memory.
  // INTERNAL on failure.
  virtual absl::Status CopyIn(uint64_t offset, const void* from, size_t n) = 0;
  virtual absl::Status CopyOut(uint64_t offset, void* to, size_t n) const = 0;
  // The same for a block's runs at once (a GPU waits once for them all).
  virtual absl::Status CopyInRuns(std::span<const SlabRun> runs);
  // CopyInRuns from memory the caller may reuse as soon as it returns, but
  // whose copies need not have landed by then (a GPU's, staged through its
  // own pinned memory): copies out of the slab afterwards still see them.
  virtual absl::Status CopyInRunsNoWait(std::span<const SlabRun> runs) { return CopyInRuns(runs); }
  virtual absl::Status CopyOutRuns(std::span<const SlabRun> runs) const;
  // CopyOutRuns, with the CRC32C of each record's first `bytes` bytes
  // computed where they lie first (by a GPU's own threads, at its memory's
  // rate) into crcs[k], so the caller need not read the copies to check
  // them. Pages are `page_size` bytes. UNIMPLEMENTED where the slab does
  // not do this (nothing copied then).
  virtual absl::Status CopyOutRunsWithCrc(std::span<const SlabRun> /*runs*/, std::span<const SlabRecord> /*records*/,
                                          uint32_t /*page_size*/, std::span<uint32_t> /*crcs*/) const {
    return absl::UnimplementedError("this slab does not check records");
  }
  // A host buffer copies in and out of the slab go fastest through (pinned
  // memory for a GPU), freed when the last owner lets go.
  virtual std::shared_ptr<uint8_t> AllocateHost(size_t n) const = 0;
  // Page-locks host memory this process maps (a host tier's pages) so
  // copies between it and the slab run at the pinned rate; UNIMPLEMENTED
  // where that means nothing (host memory). UnpinHost before the memory is
  // unmapped or remapped.
  virtual absl::Status PinHost(void* /*p*/, size_t /*n*/) { return absl::UnimplementedError("nothing to pin"); }
  virtual void UnpinHost(void* /*p*/) {}
  // A buffer of exactly `bytes` other processes can open, and
  // device-to-device copies of runs into it (a lease's records' pages: a
  // GPU waits once a call); UNIMPLEMENTED where there is no such thing
  // (host memory).
  virtual absl::StatusOr<std::unique_ptr<ExportedBuffer>> Export(uint64_t /*bytes*/) {
    return absl::UnimplementedError("this memory cannot be exported");
  }
  virtual absl::Status CopyToExported(std::span<const ExportRun> /*runs*/, ExportedBuffer& /*to*/) {
    return absl::UnimplementedError("this memory cannot be exported");
  }
};

// Host memory behind the slab contract: every access is a copy.
class StagedHostSlab final : public SlabMemory {
 public:
  static absl::StatusOr<std::unique_ptr<StagedHostSlab>> Create(uint64_t bytes);
  ~StagedHostSlab() override;
  uint64_t size() const override { return size_; }
  std::string name() const override { return "host (staged)"; }
  absl::Status CopyIn(uint64_t offset, const void* from, size_t n) override;
  absl::Status CopyOut(uint64_t offset, void* to, size_t n) const override;
  // The CRCs computed over its memory, as a GPU computes them over its
  // own: the same path runs here.
  absl::Status CopyOutRunsWithCrc(std::span<const SlabRun> runs, std::span<const SlabRecord> records,
                                  uint32_t page_size, std::span<uint32_t> crcs) const override;
  std::shared_ptr<uint8_t> AllocateHost(size_t n) const override;

 private:
  StagedHostSlab(uint8_t* base, uint64_t size) : base_(base), size_(size) {}
  uint8_t* base_;
  uint64_t size_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_SLAB_MEMORY_H_
