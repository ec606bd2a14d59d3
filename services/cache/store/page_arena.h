// One region of memory carved into fixed-size pages, handed out by index.
// A block occupies as many pages as its record needs, anywhere in the region,
// so there is no external fragmentation and no malloc per block; the region
// is reserved once at start-up and the OS backs pages only when first
// written.
//
// The pages are grouped in segments, and every segment belongs to one owner
// (the cache passes a segment owner: a group of namespaces and a tenant,
// SegmentOwner) while it
// holds pages: an owner's pages come from its own segments, and only an
// empty segment changes owner. In a shared arena each segment is its own
// sealed memfd, so the cache can hand a same-host reader the segments of
// one group, read-only, without exposing any other group's bytes. A
// segment that changes owner starts a new generation with only zeros in
// it: if its memfd was ever handed out
// (MarkExported), a fresh memfd, so a stale mapping keeps reading the old
// owner's bytes (the memfd's write seal keeps them from being punched out;
// they are freed when the last reader unmaps), never the new owner's; if
// not, the same memfd cleared in place, which
// keeps its pages (a fresh memfd faults in every page again, most of the
// cost of storing under eviction).
// Once owners start taking segments readers had, fresh memfds are made
// ahead, their pages mapped, on a thread of their own (SegmentSpares).
//
// An arena may instead live in a slab the process reaches only by copies (a
// GPU's memory, SlabMemory): then it is not addressable, and its pages are
// written and read with Write and Read alone.
//
// Taking and freeing pages is not thread-safe: BlockStore serializes it
// under its lock. Making a segment ready (clearing it or mapping its new
// memfd, pinning it) is slow, so Allocate only marks what needs it and
// Prepare does it without that lock; Prepare is thread-safe.
#ifndef KVTIER_SERVICES_CACHE_STORE_PAGE_ARENA_H_
#define KVTIER_SERVICES_CACHE_STORE_PAGE_ARENA_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/cache/store/segment_spares.h"
#include "services/cache/store/slab_memory.h"

namespace kvtier::cache {

struct ArenaOptions {
  uint64_t capacity = 0;  // bytes; floor(capacity / page_size) pages
  uint32_t page_size = 16 * 1024;
  uint32_t segment_pages = 64;  // the last segment may be shorter
  bool shared = false;          // memfd-backed segments (else anonymous memory)
  // In a shared arena, new memfds for segments that readers had are made
  // ahead on a thread (SegmentSpares); off only to measure what that saves.
  bool make_segments_ahead = true;
  // Pages in this slab instead of host memory (`shared` does not apply);
  // the capacity is capped at its size.
  std::shared_ptr<SlabMemory> slab;
  // Host pages that are copied to and from this slab (a GPU's, the tier
  // above): each segment pinned with it from its first use, so those
  // copies run at the pinned rate.
  std::shared_ptr<SlabMemory> pin_for;
};

class PageArena {
 public:
  static absl::StatusOr<std::unique_ptr<PageArena>> Create(const ArenaOptions& options);
  ~PageArena();
  PageArena(const PageArena&) = delete;
  PageArena& operator=(const PageArena&) = delete;

  uint32_t page_size() const { return page_size_; }
  uint32_t total_pages() const { return total_pages_; }
  bool shared() const { return shared_; }

  // Pages `owner` could take now: free pages of its segments plus those of
  // empty segments it does not own.
  uint32_t FreePagesFor(const std::string& owner) const;
  // Free pages in segments their owners hold and have not emptied: free,
  // but only to that owner (0 unless shared).
  uint64_t SlackPages() const;
  // Those of `owner`'s segments.
  uint64_t SlackPagesOf(const std::string& owner) const;
  // Takes `n` pages for `owner`, or returns false (and takes none). The
  // pages may not be usable yet: the caller runs Prepare on them before it
  // writes them or frees them.
  bool Allocate(uint32_t n, const std::string& owner, std::vector<uint32_t>& pages);
  // Makes the segments of pages just taken ready (without the caller's
  // lock): a segment that changed owner cleared or given its new memfd,
  // pinned for pin_for's copies. Waits for those another caller is
  // preparing.
  void Prepare(std::span<const uint32_t> pages);
  // Whether a segment holds what its generation says: false while it is
  // being prepared (nothing of its new owner in it yet).
  bool Ready(uint32_t segment);
  void Free(std::span<const uint32_t> pages);

  // Host pointers to pages: only when addressable().
  bool addressable() const { return slab_ == nullptr; }
  uint8_t* page(uint32_t index) { return base_ + size_t{index} * page_size_; }
  const uint8_t* page(uint32_t index) const { return base_ + size_t{index} * page_size_; }
  const SlabMemory* slab() const { return slab_.get(); }

  // Copies `data` to / `out.size()` bytes from [offset, ...) of a record laid
  // over `pages` (in order). INTERNAL if the slab's copy fails. Write's
  // copies into a slab may land after it returns (`data` may be reused at
  // once): later reads of the slab see them.
  absl::Status Write(std::span<const uint32_t> pages, size_t offset, std::string_view data);
  absl::Status Read(std::span<const uint32_t> pages, size_t offset, std::span<uint8_t> out) const;
  // The same for bytes in several pieces of host memory, one after another
  // in the record (a tier move's pages in another arena): in a slab, one
  // batch of copies for them all.
  absl::Status WritePieces(std::span<const uint32_t> pages, size_t offset,
                           std::span<const std::span<const uint8_t>> pieces);
  absl::Status ReadPieces(std::span<const uint32_t> pages, size_t offset,
                          std::span<const std::span<uint8_t>> pieces) const;
  // ReadPieces for several records at once: in a slab, one batch for all.
  // With `crcs` (one a record; else empty), a slab that can (a GPU's) also
  // computes the CRC32C of each record's first crc_bytes where they lie,
  // into crcs[k]; where it cannot, crcs stay empty (check the copies).
  struct RecordPieces {
    std::span<const uint32_t> pages;
    size_t offset;  // with crcs: where the record starts in its first page
    std::span<const std::span<uint8_t>> pieces;
    uint64_t crc_bytes = 0;  // with crcs: from the record's first byte
  };
  absl::Status ReadRecords(std::span<const RecordPieces> records, std::span<std::optional<uint32_t>> crcs = {}) const;
  // Copies records of a slab arena device to device into `to` (CUDA IPC),
  // all in one batch (a GPU waits once): record k's `size` bytes from
  // `offset` in its first page land at `at` in the buffer.
  struct RecordExport {
    std::span<const uint32_t> pages;
    size_t offset;
    size_t size;
    uint64_t at;
  };
  absl::Status CopyToExported(std::span<const RecordExport> records, ExportedBuffer& to) const;
  // The first `size` bytes of a record laid over `pages`, a piece a run of
  // adjacent pages: only when addressable().
  std::vector<std::span<uint8_t>> PagePieces(std::span<const uint32_t> pages, size_t size) const;

  // Where a page lives, for handing its segment to another process.
  uint32_t segment_pages() const { return segment_pages_; }
  uint32_t SegmentOf(uint32_t page) const { return page / segment_pages_; }
  uint32_t segment_count() const { return static_cast<uint32_t>(segments_.size()); }
  uint64_t SegmentBytes(uint32_t segment) const;
  uint64_t Generation(uint32_t segment) const { return segments_[segment].generation; }
  const std::string& Owner(uint32_t segment) const { return segments_[segment].owner; }
  // The segment's memfd (owned by the arena), or -1 when it has none (not a
  // shared arena, or the memfd could not be made and anonymous memory
  // stands in).
  int SegmentFd(uint32_t segment) const { return segments_[segment].fd; }
  // Its memfd has gone to another process in this generation.
  void MarkExported(uint32_t segment) { segments_[segment].exported = true; }
  // Bytes of memfds made ahead or waiting to be closed: memory beyond
  // the capacity.
  uint64_t SegmentsAheadBytes();
  // Waits until the memfds made ahead are ready and those let go are
  // closed; at once when none are made (for tests and benchmarks).
  void WaitForSegmentsAhead();

 private:
  struct Segment {
    std::string owner;
    uint64_t generation = 0;
    int fd = -1;
    bool exported = false;       // fd handed out in this generation
    std::vector<uint32_t> free;  // a stack, lowest page on top
    uint32_t pages = 0;
    // fd, exported, dirty and pinned change only on the thread preparing
    // it, or under the caller's lock while it is ready.
    bool dirty = false;   // changed owner: to be cleared (or a new memfd)
    bool pinned = false;  // with pin_for, over its current mapping
  };
  enum class Readiness : uint8_t { kReady, kWaiting, kPreparing };
  struct OwnerPages {
    std::set<uint32_t> with_free;  // its segments with a free page
    uint32_t free = 0;             // free pages in them
    uint32_t empty_pages = 0;      // of which in wholly empty segments
    uint32_t segments = 0;         // segments it owns
  };

  PageArena(uint8_t* base, size_t bytes, const ArenaOptions& options, uint32_t pages);
  // WritePieces, waiting for a slab's copies to land or not.
  absl::Status WriteRuns(std::span<const uint32_t> pages, size_t offset,
                         std::span<const std::span<const uint8_t>> pieces, bool wait);
  // Calls copy(byte offset in the arena, host address, n) for each run of
  // the record from `offset` on that lies in one page and one piece.
  template <typename Piece, typename Copy>
  void ForEachRun(std::span<const uint32_t> pages, size_t offset, std::span<const Piece> pieces, Copy copy) const;
  // Owners are told apart only in a shared arena; elsewhere all are one.
  const std::string& Key(const std::string& owner) const;
  // Gives an empty segment to `owner` in a new generation: in a shared
  // arena, to be cleared by Prepare.
  void Reassign(uint32_t segment, const std::string& owner);
  // Marks a segment just handed out for Prepare, if it needs it.
  void MarkForPrepare(uint32_t segment);
  bool NeedsPrepare(const Segment& seg) const {
    return seg.dirty || (pin_for_ != nullptr && !seg.pinned && !pin_refused_);
  }
  // Prepare's work on one segment (its own now).
  void PrepareSegment(uint32_t segment);
  // Only zeros in a dirty segment: cleared in place when only this process
  // maps its memfd, else a new memfd mapped over it.
  void Clear(uint32_t segment);
  // A new memfd mapped over [at, at + bytes), -1 if none could be: one made
  // ahead when there is one ready (`replacing` one that readers had starts
  // making them).
  int MapNewMemfd(uint8_t* at, size_t bytes, bool replacing);
  // Closes a memfd let go: on the spares' thread when there is one.
  void Retire(int fd, size_t bytes);
  // The spares for memfds of `bytes` (a whole segment's; the last one may
  // be shorter), or null; made the first time `replacing` one readers had.
  SegmentSpares* SparesFor(size_t bytes, bool replacing);
  uint8_t* SegmentAddress(uint32_t segment) const { return base_ + size_t{segment} * segment_pages_ * page_size_; }
  // Pins a segment's pages with pin_for, unless done or refused before
  // (refused: logged once; copies then go slower, still right).
  void Pin(uint32_t segment);
  void Unpin(uint32_t segment);

  uint8_t* base_;  // null with a slab
  size_t mapped_bytes_;
  std::shared_ptr<SlabMemory> slab_;
  std::shared_ptr<SlabMemory> pin_for_;  // null: nothing to pin for
  std::atomic<bool> pin_refused_ = false;
  uint32_t page_size_;
  uint32_t segment_pages_;
  uint32_t total_pages_;
  bool shared_;
  bool make_segments_ahead_;
  std::vector<Segment> segments_;
  std::unordered_map<std::string, OwnerPages> owners_;
  std::set<uint32_t> empty_;  // wholly free segments, whoever owns them
  uint32_t empty_pages_ = 0;  // pages in them
  // Memfds made ahead: one a kSegmentsPerSpare segments, at most
  // kMostSpares (their pages are memory beyond the capacity: at most 1/16
  // of the arena's, and 32 MiB with 4 MiB segments); null until needed.
  static constexpr size_t kSegmentsPerSpare = 16;
  static constexpr size_t kMostSpares = 8;

  // Segments that need preparing (shared, or pinned for a slab).
  const bool prepares_;
  absl::Mutex prep_mu_;
  absl::CondVar prepared_;  // a segment became ready
  std::vector<Readiness> readiness_ ABSL_GUARDED_BY(prep_mu_);
  std::unique_ptr<SegmentSpares> spares_ ABSL_GUARDED_BY(prep_mu_);
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_PAGE_ARENA_H_
