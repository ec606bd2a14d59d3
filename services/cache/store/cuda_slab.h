// The device tier in GPU memory: SlabMemory over kernels' cuda::DeviceSlab.
// Built only with CUDA (KVTIER_HAVE_CUDA).
#ifndef KVTIER_SERVICES_CACHE_STORE_CUDA_SLAB_H_
#define KVTIER_SERVICES_CACHE_STORE_CUDA_SLAB_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kvtier/kernels/cuda_slab.h"
#include "services/cache/store/slab_memory.h"

namespace kvtier::cache {

class CudaSlab final : public SlabMemory {
 public:
  // A slab of `bytes` on the current GPU; FAILED_PRECONDITION without one.
  static absl::StatusOr<std::unique_ptr<CudaSlab>> Create(uint64_t bytes);
  uint64_t size() const override { return slab_->size(); }
  std::string name() const override { return slab_->name(); }
  absl::Status CopyIn(uint64_t offset, const void* from, size_t n) override;
  absl::Status CopyOut(uint64_t offset, void* to, size_t n) const override;
  absl::Status CopyInRuns(std::span<const SlabRun> runs) override;
  absl::Status CopyInRunsNoWait(std::span<const SlabRun> runs) override;
  absl::Status CopyOutRuns(std::span<const SlabRun> runs) const override;
  absl::Status CopyOutRunsWithCrc(std::span<const SlabRun> runs, std::span<const SlabRecord> records,
                                  uint32_t page_size, std::span<uint32_t> crcs) const override;
  // Pinned: Get answers copied out of the slab go to gRPC from here.
  std::shared_ptr<uint8_t> AllocateHost(size_t n) const override;
  absl::Status PinHost(void* p, size_t n) override;
  void UnpinHost(void* p) override;
  // A cuda::DeviceBuffer, its IPC handle for a same-host GPU client.
  absl::StatusOr<std::unique_ptr<ExportedBuffer>> Export(uint64_t bytes) override;
  absl::Status CopyToExported(std::span<const ExportRun> runs, ExportedBuffer& to) override;

 private:
  explicit CudaSlab(std::unique_ptr<kernels::cuda::DeviceSlab> slab) : slab_(std::move(slab)) {}
  std::unique_ptr<kernels::cuda::DeviceSlab> slab_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_CUDA_SLAB_H_
