#include "services/cache/cuda_slab.h"

#include <string>

#include "kvtier/kernels/cuda_codec.h"
#include "services/common/status.h"

namespace kvtier::cache {

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

std::shared_ptr<uint8_t> CudaSlab::AllocateHost(size_t n) const { return kernels::cuda::DeviceSlab::AllocatePinned(n); }

}  // namespace kvtier::cache
