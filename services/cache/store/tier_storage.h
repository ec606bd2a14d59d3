// Where one tier of the store keeps its block records. BlockStore's policy
// (LRU, demotion and promotion, leases, CRC checks, visibility) talks to
// every tier through this one interface, and never asks which kind it is;
// each kind of storage is one implementation:
//
//   PrivatePages    pages in this process's own memory
//   SharedSegments  pages in memfd segments, one segment owner each (a
//                   tenant's blocks of the namespaces that may share them,
//                   SegmentOwner), that same-host readers map read-only
//                   (the fast path)
//   SlabPages       pages in a slab reached only by copies (a GPU's memory)
//   DiskFiles       one file per record (disk_dir.h)
//
// Room is taken and given back under the store's lock (and prepared
// without it); a record's bytes are read and written without it, while the record is pinned or its room
// reserved (its pages do not change then). Not thread-safe otherwise.
#ifndef KVTIER_SERVICES_CACHE_STORE_TIER_STORAGE_H_
#define KVTIER_SERVICES_CACHE_STORE_TIER_STORAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "services/cache/store/disk_dir.h"
#include "services/cache/store/page_arena.h"
#include "services/cache/store/slab_memory.h"
#include "services/kvblock/block_key.h"

namespace kvtier::cache {

// The tiers, fastest first; numbered as kvtier.v1.Tier.
enum class TierKind : int { kDevice = 1, kHost = 2, kDisk = 3 };

// One record in a tier: which block it is, its pages (none for a file),
// its size, and the tenant whose Put stored it (what its room is charged to).
struct RecordRoom {
  const std::string& ns;
  const kvblock::BlockHash& hash;
  const std::vector<uint32_t>& pages;
  size_t size;
  const std::string& owner;
};

// A record's bytes as read out of a tier.
struct RecordBytes {
  // Spans over the tier's own memory, or over `owned`.
  std::vector<std::span<const uint8_t>> pieces;
  std::shared_ptr<const uint8_t> owned;  // a copy: a file read, pages copied out of a slab
  // The CRC32C of the record's bytes before its trailer, computed where it
  // lay (a GPU's slab), when the storage can; else unset.
  std::optional<uint32_t> crc;
};

// A stretch of a record in a shared segment (SharedSegments).
struct SharedPiece {
  uint32_t tier = 0;  // index into the store's tiers, fastest first
  uint32_t segment = 0;
  uint64_t generation = 0;
  uint64_t offset = 0;  // in the segment
  uint64_t length = 0;
};

// What owns a shared tier's segments: a segment group (namespaces the same
// readers may read: a reader of one may map them all) and the tenant whose
// blocks they hold, so that the free pages a segment keeps from others are
// that tenant's to pay for (BlockStore charges them).
std::string SegmentOwner(std::string_view group, std::string_view tenant);
// The group of a segment owner: what a reader is checked against.
std::string_view SegmentOwnerGroup(std::string_view owner);

class TierStorage {
 public:
  virtual ~TierStorage() = default;

  // ---- Room (under the store's lock) ----
  // Whether a record of `bytes` fits at all, the tier empty.
  virtual bool Fits(size_t bytes) const = 0;
  // The memory a record of `bytes` takes here (whole pages in a page
  // tier): what the tier's use and an owner's quota count.
  virtual uint64_t BytesTaken(size_t bytes) const { return bytes; }
  // Whether a record of `bytes` of segment owner `owner` (SegmentOwner)
  // fits now; `free_bytes`: the tier's capacity less what it holds.
  virtual bool HasRoom(size_t bytes, const std::string& owner, uint64_t free_bytes) const = 0;
  // Takes room for a record of `bytes` of segment owner `owner`: its pages
  // (none for a file). False, and nothing taken, when there is none. The
  // taker runs Prepare on the pages, without the lock, before anything else.
  virtual bool Take(size_t bytes, const std::string& owner, std::vector<uint32_t>& pages) = 0;
  // Gives back a record's room; `written` says whether its bytes were
  // stored there (a file then goes too).
  virtual void Give(const RecordRoom& room, bool written) = 0;

  // ---- Bytes (without the lock) ----
  // Makes room just taken ready to be written: the slow part of taking it
  // (clearing memory a reader had, mapping a new segment, pinning), out
  // of the store's lock. Thread-safe.
  virtual void Prepare(const std::vector<uint32_t>& /*pages*/) const {}
  virtual absl::StatusOr<RecordBytes> Read(const RecordRoom& room) const = 0;
  // Copies each record into `to[k]` (host memory, record k's size in
  // pieces), with `crcs[k]` as Read's crc: a slab does them all in one
  // batch (one wait for a GPU). One status a record.
  virtual std::vector<absl::Status> ReadInto(std::span<const RecordRoom> rooms,
                                             std::span<const std::vector<std::span<uint8_t>>> to,
                                             std::span<std::optional<uint32_t>> crcs) const;
  // Stores a whole record, given in pieces, in its room. RESOURCE_EXHAUSTED
  // when the storage under it is full (a disk before its capacity).
  virtual absl::Status Write(const RecordRoom& room, const std::vector<std::span<const uint8_t>>& pieces) const = 0;
  // Writes bytes at `offset` of a record being assembled (Put). Only tiers
  // that can be the first one.
  virtual absl::Status WriteAt(const RecordRoom& room, size_t offset, std::string_view bytes) const;
  // The record's room as host memory to be written into; empty when the
  // storage is not host memory.
  virtual std::vector<std::span<uint8_t>> Memory(const RecordRoom& /*room*/) const { return {}; }

  // ---- What kind of storage it is, without naming it ----
  // Read gives spans over its own memory: a read can pin in place.
  virtual bool in_memory() const { return false; }
  // Moves out of it are cheaper in batches of up to this many bytes (a
  // GPU's copies wait once a batch); 0: one at a time.
  virtual uint64_t MoveBatchBytes(uint64_t /*capacity*/) const { return 0; }
  // Its bookkeeping beyond the records' bytes.
  virtual uint64_t MetadataBytes() const { return 0; }
  // Free bytes that only one segment owner can use (PageArena::SlackPages):
  // in all, and of `owner`'s segments.
  virtual uint64_t SlackBytes() const { return 0; }
  virtual uint64_t SlackBytesOf(const std::string& /*owner*/) const { return 0; }
  // The most one segment takes (0: no segments).
  virtual uint64_t SegmentBytes() const { return 0; }
  // Records it still holds from before a restart (a disk's files); those
  // that do not verify are dropped and counted in `corrupt`.
  virtual std::vector<DiskRecord> Recover(uint64_t& /*corrupt*/) { return {}; }
  // Orders records for the next start's Recover: these after every other
  // record, the last of them the newest.
  virtual void OrderForRestart(std::span<const RecordRoom> /*oldest_first*/) const {}
  // The slab it lives in, if any (a GPU's memory).
  virtual SlabMemory* slab() const { return nullptr; }

  // ---- Same-host readers ----
  // Whether same-host readers can map its records (SharedPieces).
  virtual bool shareable() const { return false; }
  // Where the record lies in shared segments, in order, pages that follow
  // each other merged; empty when it is not all in shared memory.
  virtual std::vector<SharedPiece> SharedPieces(uint32_t /*tier*/, const RecordRoom& /*room*/) const { return {}; }
  // A new read-only descriptor of a segment for a reader of segment group
  // `group` (its owner's group).
  virtual absl::StatusOr<int> OpenShared(uint32_t segment, uint64_t generation, const std::string& group);
  // A record to copy into an exported buffer, and where it goes there.
  struct ToExport {
    RecordRoom room;
    uint64_t at;
  };
  // Copies records device to device into `to` (CUDA IPC), all in one batch
  // (a GPU waits once).
  virtual absl::Status CopyToExported(std::span<const ToExport> records, ExportedBuffer& to) const;
};

// The storage for one tier of pages, by the arena's kind: private memory,
// shared segments, or a slab.
std::unique_ptr<TierStorage> PagesStorage(std::unique_ptr<PageArena> arena);
// One file per record under `disk`, at most `capacity` bytes of records.
std::unique_ptr<TierStorage> DiskStorage(std::unique_ptr<DiskDir> disk, uint64_t capacity);

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_TIER_STORAGE_H_
