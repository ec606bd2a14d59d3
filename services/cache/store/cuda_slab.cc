#include "services/cache/store/cuda_slab.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtier/kernels/cuda_codec.h"
#include "kvtier/kernels/cuda_ipc.h"
#include "services/base/status.h"

namespace kvtier::cache {
namespace {

class CudaExportedBuffer final : public ExportedBuffer {
 public:
  explicit CudaExportedBuffer(std::unique_ptr<kernels::cuda::DeviceBuffer> buffer) : buffer_(std::move(buffer)) {}
  uint64_t size() const override { return buffer_->size(); }
  std::string handle() const override { return std::string(buffer_->handle().data(), buffer_->handle().size()); }
  uint8_t* data() const { return buffer_->data(); }

 private:
  std::unique_ptr<kernels::cuda::DeviceBuffer> buffer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaSlab>> CudaSlab::Create(uint64_t bytes) {
  std::string why;
  if (!kernels::cuda::DevicePresent(&why)) return absl::FailedPreconditionError("no usable GPU: " + why);
  std::unique_ptr<kernels::cuda::DeviceSlab> slab;
  KVTIER_RETURN_IF_ERROR(FromKernelStatus(kernels::cuda::DeviceSlab::Create(bytes, slab)));
  return std::unique_ptr<CudaSlab>(new CudaSlab(std::move(slab)));
}

absl::Status CudaSlab::CopyIn(uint64_t offset, const void* from, size_t n) {
  return FromKernelStatus(slab_->CopyIn(offset, from, n));
}

absl::Status CudaSlab::CopyOut(uint64_t offset, void* to, size_t n) const {
  return FromKernelStatus(slab_->CopyOut(offset, to, n));
}

absl::Status CudaSlab::CopyInRuns(std::span<const SlabRun> runs) { return FromKernelStatus(slab_->CopyInRuns(runs)); }

absl::Status CudaSlab::CopyInRunsNoWait(std::span<const SlabRun> runs) {
  return FromKernelStatus(slab_->CopyInRunsNoWait(runs));
}

absl::Status CudaSlab::CopyOutRuns(std::span<const SlabRun> runs) const {
  return FromKernelStatus(slab_->CopyOutRuns(runs));
}

absl::Status CudaSlab::CopyOutRunsWithCrc(std::span<const SlabRun> runs, std::span<const SlabRecord> records,
                                          uint32_t page_size, std::span<uint32_t> crcs) const {
  if (crcs.size() != records.size()) return absl::InternalError("one CRC a record");
  if (!kernels::cuda::DeviceSlab::ChecksPagesOf(page_size)) {
    return absl::UnimplementedError(absl::StrCat("the GPU checks records over pages of a power of two bytes (",
                                                 kernels::cuda::DeviceSlab::kMinCrcPage, " or more) only"));
  }
  std::vector<kernels::cuda::DeviceSlab::Record> kernel_records;
  kernel_records.reserve(records.size());
  for (const SlabRecord& r : records) kernel_records.push_back({r.page_offsets, r.bytes});
  return FromKernelStatus(slab_->CopyOutRunsWithCrc(runs, kernel_records, page_size, crcs.data()));
}

absl::StatusOr<std::unique_ptr<ExportedBuffer>> CudaSlab::Export(uint64_t bytes) {
  std::unique_ptr<kernels::cuda::DeviceBuffer> buffer;
  KVTIER_RETURN_IF_ERROR(FromKernelStatus(kernels::cuda::DeviceBuffer::Create(bytes, buffer)));
  return std::unique_ptr<ExportedBuffer>(new CudaExportedBuffer(std::move(buffer)));
}

absl::Status CudaSlab::CopyToExported(std::span<const ExportRun> runs, ExportedBuffer& to) {
  auto& buffer = static_cast<CudaExportedBuffer&>(to);  // only this class makes them
  std::vector<SlabRun> device_runs;
  device_runs.reserve(runs.size());
  for (const ExportRun& r : runs) {
    if (r.to_offset > buffer.size() || r.n > buffer.size() - r.to_offset) {
      return absl::InternalError("copy outside the exported buffer");
    }
    device_runs.push_back({r.offset, r.n, buffer.data() + r.to_offset});
  }
  return FromKernelStatus(slab_->CopyToDeviceRuns(device_runs));
}

std::shared_ptr<uint8_t> CudaSlab::AllocateHost(size_t n) const { return kernels::cuda::DeviceSlab::AllocatePinned(n); }

absl::Status CudaSlab::PinHost(void* p, size_t n) { return FromKernelStatus(kernels::cuda::DeviceSlab::PinHost(p, n)); }

void CudaSlab::UnpinHost(void* p) { kernels::cuda::DeviceSlab::UnpinHost(p); }

}  // namespace kvtier::cache
