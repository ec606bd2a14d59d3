#include "services/cache/store/slab_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
#include "services/kvblock/crc32c.h"

namespace kvtier::cache {
namespace {

absl::Status CheckRange(uint64_t offset, size_t n, uint64_t size) {
  if (offset > size || n > size - offset) {
    return absl::InternalError(absl::StrCat("slab copy [", offset, ", +", n, ") outside ", size, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagedHostSlab>> StagedHostSlab::Create(uint64_t bytes) {
  // Committed as written, like the page arenas.
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", bytes, " bytes: ", std::strerror(errno)));
  }
  return std::unique_ptr<StagedHostSlab>(new StagedHostSlab(static_cast<uint8_t*>(base), bytes));
}

absl::Status SlabMemory::CopyInRuns(std::span<const SlabRun> runs) {
  for (const SlabRun& r : runs) KVTIER_RETURN_IF_ERROR(CopyIn(r.offset, r.host, r.n));
  return absl::OkStatus();
}

absl::Status SlabMemory::CopyOutRuns(std::span<const SlabRun> runs) const {
  for (const SlabRun& r : runs) KVTIER_RETURN_IF_ERROR(CopyOut(r.offset, r.host, r.n));
  return absl::OkStatus();
}

StagedHostSlab::~StagedHostSlab() { munmap(base_, size_); }

absl::Status StagedHostSlab::CopyIn(uint64_t offset, const void* from, size_t n) {
  if (absl::Status s = CheckRange(offset, n, size_); !s.ok()) return s;
  std::memcpy(base_ + offset, from, n);
  return absl::OkStatus();
}

absl::Status StagedHostSlab::CopyOut(uint64_t offset, void* to, size_t n) const {
  if (absl::Status s = CheckRange(offset, n, size_); !s.ok()) return s;
  std::memcpy(to, base_ + offset, n);
  return absl::OkStatus();
}

absl::Status StagedHostSlab::CopyOutRunsWithCrc(std::span<const SlabRun> runs, std::span<const SlabRecord> records,
                                                uint32_t page_size, std::span<uint32_t> crcs) const {
  if (crcs.size() != records.size()) return absl::InternalError("one CRC a record");
  for (size_t k = 0; k < records.size(); ++k) {
    const SlabRecord& r = records[k];
    if (r.bytes > r.page_offsets.size() * uint64_t{page_size}) {
      return absl::InternalError("record longer than its pages");
    }
    uint32_t crc = 0;
    for (uint64_t done = 0, page = 0; done < r.bytes; done += page_size, ++page) {
      const size_t n = std::min<uint64_t>(page_size, r.bytes - done);
      KVTIER_RETURN_IF_ERROR(CheckRange(r.page_offsets[page], n, size_));
      crc = kvblock::Crc32cExtend(crc, base_ + r.page_offsets[page], n);
    }
    crcs[k] = crc;
  }
  return CopyOutRuns(runs);
}

std::shared_ptr<uint8_t> StagedHostSlab::AllocateHost(size_t n) const {
  return std::shared_ptr<uint8_t>(new uint8_t[n], std::default_delete<uint8_t[]>());
}

}  // namespace kvtier::cache
