// One region of memory carved into fixed-size pages, handed out by index.
// A block occupies as many pages as its record needs, anywhere in the region,
// so there is no external fragmentation and no malloc per block; the region
// is reserved once at start-up and the OS backs pages only when first
// written. Not thread-safe: BlockStore serializes allocation.
#ifndef KVTIER_SERVICES_CACHE_PAGE_ARENA_H_
#define KVTIER_SERVICES_CACHE_PAGE_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::cache {

class PageArena {
 public:
  // Reserves floor(capacity / page_size) pages of anonymous memory.
  static absl::StatusOr<std::unique_ptr<PageArena>> Create(uint64_t capacity, uint32_t page_size);
  ~PageArena();
  PageArena(const PageArena&) = delete;
  PageArena& operator=(const PageArena&) = delete;

  uint32_t page_size() const { return page_size_; }
  uint32_t total_pages() const { return total_pages_; }
  uint32_t free_pages() const { return static_cast<uint32_t>(free_.size()); }

  // Takes `n` free pages, or returns false (and takes none) if fewer are free.
  bool Allocate(uint32_t n, std::vector<uint32_t>& pages);
  void Free(const std::vector<uint32_t>& pages);

  uint8_t* page(uint32_t index) { return base_ + size_t{index} * page_size_; }
  const uint8_t* page(uint32_t index) const { return base_ + size_t{index} * page_size_; }

 private:
  PageArena(uint8_t* base, size_t bytes, uint32_t page_size, uint32_t pages);

  uint8_t* base_;
  size_t mapped_bytes_;
  uint32_t page_size_;
  uint32_t total_pages_;
  std::vector<uint32_t> free_;  // a stack: recently freed pages are reused first
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_PAGE_ARENA_H_
