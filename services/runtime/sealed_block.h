// One sealed latent block's payload (one layer's tokens in a codec):
// immutable once made, shared by every copy of the cache that holds it (its
// own bytes, or a view into memory it keeps alive), and named by an id that
// no other payload in the process ever has, so a device can keep its own
// copy of the bytes under that id and know it is current.
// Thread-safe (immutable).
#ifndef KVTIER_SERVICES_RUNTIME_SEALED_BLOCK_H_
#define KVTIER_SERVICES_RUNTIME_SEALED_BLOCK_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace kvtier::runtime {

class SealedBlock {
 public:
  // A payload becomes a block (implicitly: `blocks.push_back(bytes)`).
  SealedBlock(std::vector<uint8_t> bytes)  // NOLINT(google-explicit-constructor)
      : SealedBlock(std::make_shared<const std::vector<uint8_t>>(std::move(bytes))) {}
  // `bytes` inside memory that `owner` keeps alive (a fetched record holding
  // every layer's payload): no copy.
  SealedBlock(std::shared_ptr<const void> owner, std::span<const uint8_t> bytes)
      : owner_(std::move(owner)), bytes_(bytes), id_(NextId()) {}

  std::span<const uint8_t> bytes() const { return bytes_; }
  operator std::span<const uint8_t>() const { return bytes(); }  // NOLINT: reads as its bytes
  const uint8_t* data() const { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }
  auto begin() const { return bytes_.begin(); }
  auto end() const { return bytes_.end(); }
  uint64_t id() const { return id_; }
  // Equal bytes (ids aside).
  friend bool operator==(const SealedBlock& a, const SealedBlock& b) { return std::ranges::equal(a.bytes_, b.bytes_); }

 private:
  explicit SealedBlock(std::shared_ptr<const std::vector<uint8_t>> bytes)
      : SealedBlock(bytes, std::span<const uint8_t>(*bytes)) {}
  static uint64_t NextId() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
  std::shared_ptr<const void> owner_;
  std::span<const uint8_t> bytes_;
  uint64_t id_;
};

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_SEALED_BLOCK_H_
