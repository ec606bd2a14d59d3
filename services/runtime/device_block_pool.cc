#include "services/runtime/device_block_pool.h"

#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "kvtier/kernels/cuda_device.h"
#include "services/base/status.h"

namespace kvtier::runtime {

absl::StatusOr<std::unique_ptr<DeviceBlockPool>> DeviceBlockPool::Create(size_t block_bytes, uint32_t slots) {
  if (block_bytes == 0 || slots == 0) return absl::InvalidArgumentError("an empty device block pool");
  void* base = nullptr;
  const std::string what = absl::StrCat("device block pool of ", slots, " x ", block_bytes, " bytes");
  KVTIER_RETURN_IF_ERROR(FromKernelStatus(kernels::cuda::DeviceAllocate(block_bytes * slots, base, what.c_str())));
  return std::unique_ptr<DeviceBlockPool>(new DeviceBlockPool(static_cast<uint8_t*>(base), block_bytes, slots));
}

DeviceBlockPool::DeviceBlockPool(uint8_t* base, size_t block_bytes, uint32_t slots)
    : base_(base), block_bytes_(block_bytes), id_in_(slots, 0), position_(slots) {
  for (uint32_t s = 0; s < slots; ++s) position_[s] = recency_.insert(recency_.end(), s);
}

DeviceBlockPool::~DeviceBlockPool() { kernels::cuda::DeviceFree(base_); }

absl::StatusOr<bool> DeviceBlockPool::Place(std::span<const SealedBlock* const> blocks, void* stream,
                                            std::vector<int32_t>& slot_of) {
  std::unordered_set<uint64_t> wanted;
  for (const SealedBlock* b : blocks) {
    // A slot's copy reads block_bytes_ from the payload, wherever it lies.
    if (b->size() != block_bytes_) {
      return absl::InvalidArgumentError(
          absl::StrCat("a block of ", b->size(), " bytes for a pool of ", block_bytes_, "-byte slots"));
    }
    wanted.insert(b->id());
  }
  if (wanted.size() > id_in_.size()) return false;
  // Held blocks first move to the front, so the back holds only slots none
  // of `blocks` needs: those are what the missing ones take.
  std::vector<const SealedBlock*> missing;
  for (const SealedBlock* b : blocks) {
    const auto it = slot_of_id_.find(b->id());
    if (it == slot_of_id_.end()) {
      missing.push_back(b);
      continue;
    }
    recency_.splice(recency_.begin(), recency_, position_[it->second]);
  }
  for (const SealedBlock* b : missing) {
    if (slot_of_id_.count(b->id()) > 0) continue;  // the same block twice in `blocks`
    const uint32_t slot = recency_.back();
    if (id_in_[slot] != 0) slot_of_id_.erase(id_in_[slot]);
    id_in_[slot] = b->id();
    slot_of_id_[b->id()] = slot;
    recency_.splice(recency_.begin(), recency_, position_[slot]);
    if (const kernels::Status s =
            kernels::cuda::CopyQueued(base_ + size_t{slot} * block_bytes_, b->data(), block_bytes_,
                                      kernels::cuda::Copy::kHostToDevice, stream, "copying a block to the device");
        !s.ok()) {
      // What the slot holds is unknown now: forget it.
      slot_of_id_.erase(b->id());
      id_in_[slot] = 0;
      return FromKernelStatus(s);
    }
  }
  slot_of.clear();
  for (const SealedBlock* b : blocks) slot_of.push_back(static_cast<int32_t>(slot_of_id_.at(b->id())));
  return true;
}

}  // namespace kvtier::runtime
