#include "services/cache/page_arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::cache {

absl::StatusOr<std::unique_ptr<PageArena>> PageArena::Create(uint64_t capacity,
                                                             uint32_t page_size) {
  if (page_size == 0) return absl::InvalidArgumentError("page size must be positive");
  const uint64_t pages = capacity / page_size;
  if (pages == 0 || pages > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("capacity ", capacity, " bytes gives ", pages,
                                                   " pages of ", page_size, " bytes"));
  }
  const size_t bytes = pages * page_size;
  // MAP_NORESERVE: the capacity is a ceiling, not a reservation; the kernel
  // commits pages as blocks are written.
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", bytes, " bytes: ", std::strerror(errno)));
  }
  return std::unique_ptr<PageArena>(new PageArena(static_cast<uint8_t*>(base), bytes, page_size,
                                                  static_cast<uint32_t>(pages)));
}

PageArena::PageArena(uint8_t* base, size_t bytes, uint32_t page_size, uint32_t pages)
    : base_(base), mapped_bytes_(bytes), page_size_(page_size), total_pages_(pages) {
  free_.reserve(pages);
  for (uint32_t i = pages; i > 0; --i) free_.push_back(i - 1);
}

PageArena::~PageArena() { munmap(base_, mapped_bytes_); }

bool PageArena::Allocate(uint32_t n, std::vector<uint32_t>& pages) {
  if (n > free_.size()) return false;
  pages.assign(free_.end() - n, free_.end());
  free_.resize(free_.size() - n);
  return true;
}

void PageArena::Free(const std::vector<uint32_t>& pages) {
  free_.insert(free_.end(), pages.begin(), pages.end());
}

}  // namespace kvtier::cache
