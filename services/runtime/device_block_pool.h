// Sealed blocks kept in GPU memory between forward passes, under their ids
// (SealedBlock), in one pool of equal slots that the paged attention kernel
// reads through a block table: a decode step copies up only the blocks
// sealed or fetched since the step before, not the whole context. The least
// recently used slots are reused. Built only with CUDA. Not thread-safe (the
// forward pass that owns it runs one pass at a time).
#ifndef KVTIER_SERVICES_RUNTIME_DEVICE_BLOCK_POOL_H_
#define KVTIER_SERVICES_RUNTIME_DEVICE_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "services/runtime/sealed_block.h"

namespace kvtier::runtime {

class DeviceBlockPool {
 public:
  // `slots` slots of `block_bytes` on the current GPU; RESOURCE_EXHAUSTED
  // when they do not fit.
  static absl::StatusOr<std::unique_ptr<DeviceBlockPool>> Create(size_t block_bytes, uint32_t slots);
  ~DeviceBlockPool();
  DeviceBlockPool(const DeviceBlockPool&) = delete;
  DeviceBlockPool& operator=(const DeviceBlockPool&) = delete;

  size_t block_bytes() const { return block_bytes_; }
  uint32_t slots() const { return static_cast<uint32_t>(id_in_.size()); }
  const uint8_t* base() const { return base_; }

  // The slot of each of `blocks` (all block_bytes long) in `slot_of`,
  // copying up on `stream` (a cudaStream_t) the ones it does not hold, over
  // the least recently used slots that none of `blocks` is in. False, with
  // nothing changed, when they are more blocks than it has slots.
  absl::StatusOr<bool> Place(std::span<const SealedBlock* const> blocks, void* stream, std::vector<int32_t>& slot_of);

 private:
  DeviceBlockPool(uint8_t* base, size_t block_bytes, uint32_t slots);

  uint8_t* base_;
  size_t block_bytes_;
  std::unordered_map<uint64_t, uint32_t> slot_of_id_;
  std::vector<uint64_t> id_in_;  // [slot], 0: empty
  // Slots, most recently used first, and where each is in that list.
  std::list<uint32_t> recency_;
  std::vector<std::list<uint32_t>::iterator> position_;
};

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_DEVICE_BLOCK_POOL_H_
