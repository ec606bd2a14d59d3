#include "services/cache/store/page_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/cache/store/segment_spares.h"

namespace kvtier::cache {
namespace {

// Anonymous memory over [at, at + bytes): the arena's own pages, or (shared
// arenas) a stand-in when a memfd cannot be made.
bool MapAnonymous(uint8_t* at, size_t bytes) {
  return mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) !=
         MAP_FAILED;
}

// A new sealed memfd of `bytes` mapped read-write over [at, at + bytes), or
// -1.
int MapMemfd(uint8_t* at, size_t bytes) {
  int fd = -1;
  MapSealedMemfd(bytes, at, fd);
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PageArena>> PageArena::Create(const ArenaOptions& options) {
  if (options.page_size == 0 || options.segment_pages == 0) {
    return absl::InvalidArgumentError("page and segment sizes must be positive");
  }
  const uint64_t capacity =
      options.slab != nullptr ? std::min(options.capacity, options.slab->size()) : options.capacity;
  const uint64_t pages = capacity / options.page_size;
  if (pages == 0 || pages > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity ", capacity, " bytes gives ", pages, " pages of ", options.page_size, " bytes"));
  }
  const size_t bytes = pages * options.page_size;
  if (options.slab != nullptr) {
    return std::unique_ptr<PageArena>(new PageArena(nullptr, bytes, options, static_cast<uint32_t>(pages)));
  }
  // MAP_NORESERVE: the capacity is a ceiling, not a reservation; the kernel
  // commits pages as blocks are written. A shared arena only reserves the
  // addresses here; each segment's memfd is mapped when it gets an owner.
  void* base = mmap(nullptr, bytes, options.shared ? PROT_NONE : PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", bytes, " bytes: ", std::strerror(errno)));
  }
  return std::unique_ptr<PageArena>(
      new PageArena(static_cast<uint8_t*>(base), bytes, options, static_cast<uint32_t>(pages)));
}

PageArena::PageArena(uint8_t* base, size_t bytes, const ArenaOptions& options, uint32_t pages)
    : base_(base),
      mapped_bytes_(bytes),
      slab_(options.slab),
      pin_for_(options.slab == nullptr ? options.pin_for : nullptr),
      page_size_(options.page_size),
      segment_pages_(options.segment_pages),
      total_pages_(pages),
      shared_(options.shared && options.slab == nullptr),
      make_segments_ahead_(options.make_segments_ahead),
      prepares_(shared_ || pin_for_ != nullptr) {
  const uint32_t count = (pages + segment_pages_ - 1) / segment_pages_;
  segments_.resize(count);
  readiness_.assign(count, Readiness::kReady);
  OwnerPages& unowned = owners_[""];
  for (uint32_t s = 0; s < count; ++s) {
    Segment& seg = segments_[s];
    const uint32_t first = s * segment_pages_;
    seg.pages = std::min(segment_pages_, pages - first);
    for (uint32_t p = first + seg.pages; p > first; --p) seg.free.push_back(p - 1);
    unowned.with_free.insert(s);
    empty_.insert(s);
  }
  unowned.free = unowned.empty_pages = pages;
  unowned.segments = count;
  empty_pages_ = pages;
}

PageArena::~PageArena() {
  for (uint32_t s = 0; s < segments_.size(); ++s) Unpin(s);
  if (base_ != nullptr) munmap(base_, mapped_bytes_);
  for (const Segment& seg : segments_) {
    if (seg.fd >= 0) close(seg.fd);
  }
}

template <typename Piece, typename Copy>
void PageArena::ForEachRun(std::span<const uint32_t> pages, size_t offset, std::span<const Piece> pieces,
                           Copy copy) const {
  for (const Piece& piece : pieces) {
    for (size_t done = 0; done < piece.size();) {
      const size_t page = offset / page_size_, in_page = offset % page_size_;
      const size_t n = std::min(piece.size() - done, page_size_ - in_page);
      copy(size_t{pages[page]} * page_size_ + in_page, piece.data() + done, n);
      done += n;
      offset += n;
    }
  }
}

namespace {

// Whether `run` continues `last` in both memories.
bool Continues(const SlabRun& last, const SlabRun& run) {
  return last.offset + last.n == run.offset && static_cast<uint8_t*>(last.host) + last.n == run.host;
}
bool Continues(const ExportRun& last, const ExportRun& run) {
  return last.offset + last.n == run.offset && last.to_offset + last.n == run.to_offset;
}

// Appends `run`, or extends the last run when `run` continues it: a
// block's pages are often adjacent, and a GPU copies one long run much
// faster than many 64 KB ones.
template <typename Run>
void AddRun(std::vector<Run>& runs, const Run& run) {
  if (!runs.empty() && Continues(runs.back(), run)) {
    runs.back().n += run.n;
  } else {
    runs.push_back(run);
  }
}

// A range of an exported buffer as ForEachRun's piece: its data is its
// offset in the buffer.
struct BufferRange {
  uint64_t at;
  size_t n;
  uint64_t data() const { return at; }
  size_t size() const { return n; }
};

}  // namespace

absl::Status PageArena::Write(std::span<const uint32_t> pages, size_t offset, std::string_view data) {
  const std::span<const uint8_t> piece(reinterpret_cast<const uint8_t*>(data.data()), data.size());
  return WriteRuns(pages, offset, std::span(&piece, 1), /*wait=*/false);
}

absl::Status PageArena::Read(std::span<const uint32_t> pages, size_t offset, std::span<uint8_t> out) const {
  return ReadPieces(pages, offset, std::span(&out, 1));
}

absl::Status PageArena::WritePieces(std::span<const uint32_t> pages, size_t offset,
                                    std::span<const std::span<const uint8_t>> pieces) {
  return WriteRuns(pages, offset, pieces, /*wait=*/true);
}

// In a slab, the pieces' runs go as one copy (a GPU then waits once, if at
// all).
absl::Status PageArena::WriteRuns(std::span<const uint32_t> pages, size_t offset,
                                  std::span<const std::span<const uint8_t>> pieces, bool wait) {
  std::vector<SlabRun> runs;
  ForEachRun(pages, offset, pieces, [&](size_t at, const uint8_t* from, size_t n) {
    if (slab_ != nullptr) {
      AddRun(runs, {at, n, const_cast<uint8_t*>(from)});  // read only: a copy in
    } else {
      std::memcpy(base_ + at, from, n);
    }
  });
  if (runs.empty()) return absl::OkStatus();
  return wait ? slab_->CopyInRuns(runs) : slab_->CopyInRunsNoWait(runs);
}

absl::Status PageArena::CopyToExported(std::span<const RecordExport> records, ExportedBuffer& to) const {
  if (slab_ == nullptr) return absl::FailedPreconditionError("this arena's memory cannot be exported");
  std::vector<ExportRun> runs;
  for (const RecordExport& r : records) {
    const BufferRange range{r.at, r.size};
    ForEachRun(r.pages, r.offset, std::span(&range, 1), [&](size_t at, uint64_t to_offset, size_t n) {
      AddRun(runs, {at, to_offset, n});
    });
  }
  return slab_->CopyToExported(runs, to);
}

absl::Status PageArena::ReadPieces(std::span<const uint32_t> pages, size_t offset,
                                   std::span<const std::span<uint8_t>> pieces) const {
  const RecordPieces record{pages, offset, pieces};
  return ReadRecords(std::span(&record, 1));
}

absl::Status PageArena::ReadRecords(std::span<const RecordPieces> records,
                                    std::span<std::optional<uint32_t>> crcs) const {
  if (!crcs.empty() && crcs.size() != records.size()) return absl::InternalError("one CRC a record");
  for (std::optional<uint32_t>& crc : crcs) crc.reset();
  std::vector<SlabRun> runs;
  for (const RecordPieces& r : records) {
    ForEachRun(r.pages, r.offset, r.pieces, [&](size_t at, uint8_t* to, size_t n) {
      if (slab_ != nullptr) {
        AddRun(runs, {at, n, to});
      } else {
        std::memcpy(to, base_ + at, n);
      }
    });
  }
  if (runs.empty()) return absl::OkStatus();
  if (!crcs.empty()) {
    std::vector<SlabRecord> checks(records.size());
    for (size_t k = 0; k < records.size(); ++k) {
      checks[k].bytes = records[k].crc_bytes;
      for (size_t p = 0; p * page_size_ < records[k].crc_bytes; ++p) {
        // A record that starts inside its first page (a slot) lies in it.
        checks[k].page_offsets.push_back(uint64_t{records[k].pages[p]} * page_size_ + (p == 0 ? records[k].offset : 0));
      }
    }
    std::vector<uint32_t> computed(records.size());
    const absl::Status copied = slab_->CopyOutRunsWithCrc(runs, checks, page_size_, computed);
    if (copied.code() != absl::StatusCode::kUnimplemented) {
      if (copied.ok()) std::copy(computed.begin(), computed.end(), crcs.begin());
      return copied;
    }
  }
  return slab_->CopyOutRuns(runs);
}

std::vector<std::span<uint8_t>> PageArena::PagePieces(std::span<const uint32_t> pages, size_t size) const {
  std::vector<std::span<uint8_t>> pieces;
  for (size_t k = 0; k * page_size_ < size; ++k) {
    uint8_t* at = base_ + size_t{pages[k]} * page_size_;
    const size_t n = std::min<size_t>(page_size_, size - k * page_size_);
    if (!pieces.empty() && pieces.back().data() + pieces.back().size() == at) {
      pieces.back() = std::span(pieces.back().data(), pieces.back().size() + n);  // the next page: one piece
    } else {
      pieces.emplace_back(at, n);
    }
  }
  return pieces;
}

uint64_t PageArena::SegmentBytes(uint32_t segment) const { return uint64_t{segments_[segment].pages} * page_size_; }

const std::string& PageArena::Key(const std::string& owner) const {
  static const std::string kEveryone;
  return shared_ ? owner : kEveryone;
}

uint32_t PageArena::FreePagesFor(const std::string& owner) const {
  auto it = owners_.find(Key(owner));
  if (it == owners_.end()) return empty_pages_;
  return it->second.free + (empty_pages_ - it->second.empty_pages);
}

uint64_t PageArena::SlackPages() const {
  if (!shared_) return 0;
  uint64_t slack = 0;
  for (const auto& [owner, o] : owners_) slack += o.free - o.empty_pages;
  return slack;
}

uint64_t PageArena::SlackPagesOf(const std::string& owner) const {
  if (!shared_) return 0;
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.free - it->second.empty_pages;
}

bool PageArena::Allocate(uint32_t n, const std::string& owner, std::vector<uint32_t>& pages) {
  const std::string& key = Key(owner);
  if (FreePagesFor(key) < n) return false;
  pages.clear();
  pages.reserve(n);
  OwnerPages* mine = &owners_[key];
  while (pages.size() < n) {
    uint32_t s;
    if (!mine->with_free.empty()) {
      s = *mine->with_free.begin();
    } else {
      // Its own segments are full: an empty one changes hands.
      s = *empty_.begin();
      Reassign(s, key);
      mine = &owners_[key];
    }
    Segment& seg = segments_[s];
    if (shared_ && seg.generation == 0) Reassign(s, key);  // never mapped yet
    MarkForPrepare(s);
    if (seg.free.size() == seg.pages) {
      empty_.erase(s);
      empty_pages_ -= seg.pages;
      mine->empty_pages -= seg.pages;
    }
    const uint32_t take = std::min<uint32_t>(n - pages.size(), seg.free.size());
    for (uint32_t i = 0; i < take; ++i) {
      pages.push_back(seg.free.back());
      seg.free.pop_back();
    }
    mine->free -= take;
    if (seg.free.empty()) mine->with_free.erase(s);
  }
  return true;
}

void PageArena::Free(std::span<const uint32_t> pages) {
  for (uint32_t p : pages) {
    const uint32_t s = SegmentOf(p);
    Segment& seg = segments_[s];
    OwnerPages& owner = owners_[seg.owner];
    seg.free.push_back(p);
    if (seg.free.size() == 1) owner.with_free.insert(s);
    ++owner.free;
    if (seg.free.size() == seg.pages) {
      empty_.insert(s);
      empty_pages_ += seg.pages;
      owner.empty_pages += seg.pages;
    }
  }
}

void PageArena::Reassign(uint32_t s, const std::string& owner) {
  Segment& seg = segments_[s];
  if (seg.owner != owner) {
    auto old = owners_.find(seg.owner);
    old->second.with_free.erase(s);
    old->second.free -= seg.pages;
    old->second.empty_pages -= seg.pages;
    if (--old->second.segments == 0) owners_.erase(old);
    OwnerPages& mine = owners_[owner];
    mine.with_free.insert(s);
    mine.free += seg.pages;
    mine.empty_pages += seg.pages;
    ++mine.segments;
    seg.owner = owner;
  }
  ++seg.generation;
  if (!shared_) return;
  absl::MutexLock lock(&prep_mu_);
  // It is empty, so no one is preparing it (a preparer holds pages of it).
  seg.dirty = true;
}

void PageArena::MarkForPrepare(uint32_t s) {
  if (!prepares_) return;
  absl::MutexLock lock(&prep_mu_);
  if (readiness_[s] == Readiness::kReady && NeedsPrepare(segments_[s])) readiness_[s] = Readiness::kWaiting;
}

bool PageArena::Ready(uint32_t s) {
  absl::MutexLock lock(&prep_mu_);
  return readiness_[s] == Readiness::kReady;
}

void PageArena::Prepare(std::span<const uint32_t> pages) {
  if (!prepares_) return;
  std::vector<uint32_t> segments;
  for (uint32_t p : pages) {
    if (segments.empty() || segments.back() != SegmentOf(p)) segments.push_back(SegmentOf(p));
  }
  for (uint32_t s : segments) {
    {
      absl::MutexLock lock(&prep_mu_);
      while (readiness_[s] == Readiness::kPreparing) prepared_.Wait(&prep_mu_);
      if (readiness_[s] == Readiness::kReady) continue;
      readiness_[s] = Readiness::kPreparing;
    }
    PrepareSegment(s);
    absl::MutexLock lock(&prep_mu_);
    readiness_[s] = Readiness::kReady;
    prepared_.SignalAll();
  }
}

void PageArena::PrepareSegment(uint32_t s) {
  Segment& seg = segments_[s];
  if (seg.dirty) Clear(s);
  seg.dirty = false;
  Pin(s);
}

void PageArena::Clear(uint32_t s) {
  Segment& seg = segments_[s];
  uint8_t* at = SegmentAddress(s);
  const size_t bytes = SegmentBytes(s);
  if (seg.fd >= 0 && !seg.exported) {
    std::memset(at, 0, bytes);  // only this process maps it
    return;
  }
  Unpin(s);  // the pin holds the old pages, not what is mapped next
  const int old_fd = seg.fd;
  seg.exported = false;
  seg.fd = MapNewMemfd(at, bytes, /*replacing=*/old_fd >= 0);
  // No longer mapped here; a reader that still maps it keeps the old
  // owner's bytes until it unmaps (SegmentSpares::Retire).
  if (old_fd >= 0) Retire(old_fd, bytes);
  if (seg.fd < 0 && !MapAnonymous(at, bytes)) {
    // The addresses are ours and reserved; failing to map them means the
    // process is out of memory for page tables.
    Log(LogLevel::kError, "store", absl::StrCat("cannot map segment ", s, ": ", std::strerror(errno)));
    std::abort();
  }
}

SegmentSpares* PageArena::SparesFor(size_t bytes, bool replacing) {
  absl::MutexLock lock(&prep_mu_);
  if (replacing && spares_ == nullptr && make_segments_ahead_ && segments_.size() >= kSegmentsPerSpare) {
    // Owners now take segments that readers had: make memfds ahead.
    spares_ = std::make_unique<SegmentSpares>(size_t{segment_pages_} * page_size_,
                                              std::min<size_t>(kMostSpares, segments_.size() / kSegmentsPerSpare));
  }
  return spares_ != nullptr && bytes == spares_->bytes() ? spares_.get() : nullptr;
}

int PageArena::MapNewMemfd(uint8_t* at, size_t bytes, bool replacing) {
  if (SegmentSpares* spares = SparesFor(bytes, replacing)) {
    if (std::optional<SegmentSpares::Spare> spare = spares->Take(); spare && spares->MoveTo(*spare, at)) {
      return spare->fd;
    }
  }
  return MapMemfd(at, bytes);
}

void PageArena::Retire(int fd, size_t bytes) {
  if (SegmentSpares* spares = SparesFor(bytes, /*replacing=*/false)) {
    spares->Retire(fd);
  } else {
    close(fd);
  }
}

uint64_t PageArena::SegmentsAheadBytes() {
  absl::MutexLock lock(&prep_mu_);
  return spares_ != nullptr ? spares_->HeldBytes() : 0;
}

void PageArena::WaitForSegmentsAhead() {
  SegmentSpares* spares;
  {
    absl::MutexLock lock(&prep_mu_);
    spares = spares_.get();
  }
  if (spares != nullptr) spares->WaitIdle();
}

void PageArena::Pin(uint32_t s) {
  Segment& seg = segments_[s];
  if (pin_for_ == nullptr || seg.pinned || pin_refused_) return;
  const absl::Status pinned = pin_for_->PinHost(SegmentAddress(s), SegmentBytes(s));
  if (pinned.ok()) {
    seg.pinned = true;
    return;
  }
  pin_refused_ = true;
  if (pinned.code() != absl::StatusCode::kUnimplemented) {
    Log(LogLevel::kWarning, "store",
        absl::StrCat("cannot pin the host tier's pages for copies to ", pin_for_->name(), " (", pinned.message(),
                     "); they go through the driver's staging, slower"));
  }
}

void PageArena::Unpin(uint32_t s) {
  Segment& seg = segments_[s];
  if (!seg.pinned) return;
  pin_for_->UnpinHost(SegmentAddress(s));
  seg.pinned = false;
}

}  // namespace kvtier::cache
