#include "services/cache/store/tier_storage.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/base/status.h"
#include "services/cache/store/record_slots.h"
#include "services/kvblock/block_format.h"

namespace kvtier::cache {

std::vector<absl::Status> TierStorage::ReadInto(std::span<const RecordRoom> rooms,
                                                std::span<const std::vector<std::span<uint8_t>>> to,
                                                std::span<std::optional<uint32_t>> crcs) const {
  std::vector<absl::Status> read;
  for (size_t k = 0; k < rooms.size(); ++k) {
    absl::StatusOr<RecordBytes> bytes = Read(rooms[k]);
    if (!bytes.ok()) {
      read.push_back(bytes.status());
      continue;
    }
    crcs[k] = bytes->crc;
    size_t at = 0;
    for (std::span<uint8_t> piece : to[k]) {
      kvblock::CopyFromPieces(bytes->pieces, at, piece);
      at += piece.size();
    }
    read.push_back(absl::OkStatus());
  }
  return read;
}

std::string SegmentOwner(std::string_view group, std::string_view tenant) {
  std::string owner(group);
  owner += '\0';  // in no group's or tenant's name
  owner += tenant;
  return owner;
}

std::string_view SegmentOwnerGroup(std::string_view owner) { return owner.substr(0, owner.find('\0')); }

absl::Status TierStorage::WriteAt(const RecordRoom& /*room*/, size_t /*offset*/, std::string_view /*bytes*/) const {
  return absl::UnimplementedError("this tier cannot assemble records");
}

absl::StatusOr<int> TierStorage::OpenShared(uint32_t segment, uint64_t /*generation*/, const std::string& /*group*/) {
  return absl::InvalidArgumentError(absl::StrCat("no shared segment ", segment, " in this tier"));
}

absl::Status TierStorage::CopyToExported(std::span<const ToExport> /*records*/, ExportedBuffer& /*to*/) const {
  return absl::FailedPreconditionError("block is not in a slab tier");
}

namespace {

// Pages in this process's own memory; records of at most half a page in
// slots (record_slots.h).
class PrivatePages : public TierStorage {
 public:
  explicit PrivatePages(std::unique_ptr<PageArena> arena) : arena_(std::move(arena)), slots_(arena_.get()) {}

  bool Fits(size_t bytes) const override { return PagesFor(bytes) <= arena_->total_pages(); }
  uint64_t BytesTaken(size_t bytes) const override {
    const uint32_t slot = slots_.SlotBytes(bytes);
    return slot > 0 ? slot : uint64_t{PagesFor(bytes)} * arena_->page_size();
  }
  bool HasRoom(size_t bytes, const std::string& owner, uint64_t /*free_bytes*/) const override {
    const uint32_t slot = slots_.SlotBytes(bytes);
    return slot > 0 ? slots_.HasRoom(slot, owner) : arena_->FreePagesFor(owner) >= PagesFor(bytes);
  }
  bool Take(size_t bytes, const std::string& owner, std::vector<uint32_t>& pages) override {
    const uint32_t slot = slots_.SlotBytes(bytes);
    return slot > 0 ? slots_.Take(slot, owner, pages) : arena_->Allocate(PagesFor(bytes), owner, pages);
  }
  void Give(const RecordRoom& room, bool /*written*/) override {
    if (RecordSlots::IsSlot(room.pages)) {
      slots_.Give(room.pages);
    } else {
      arena_->Free(room.pages);
    }
  }
  void Prepare(const std::vector<uint32_t>& pages) const override { arena_->Prepare(RecordSlots::Pages(pages)); }

  absl::StatusOr<RecordBytes> Read(const RecordRoom& room) const override {
    RecordBytes bytes;
    for (std::span<uint8_t> piece : Memory(room)) bytes.pieces.emplace_back(piece);
    return bytes;
  }
  absl::Status Write(const RecordRoom& room, const std::vector<std::span<const uint8_t>>& pieces) const override {
    return arena_->WritePieces(RecordSlots::Pages(room.pages), RecordSlots::Offset(room.pages), pieces);
  }
  absl::Status WriteAt(const RecordRoom& room, size_t offset, std::string_view bytes) const override {
    return arena_->Write(RecordSlots::Pages(room.pages), RecordSlots::Offset(room.pages) + offset, bytes);
  }
  std::vector<std::span<uint8_t>> Memory(const RecordRoom& room) const override {
    if (!RecordSlots::IsSlot(room.pages)) return arena_->PagePieces(room.pages, room.size);
    return {std::span(arena_->page(room.pages[0]) + RecordSlots::Offset(room.pages), room.size)};
  }

  bool in_memory() const override { return true; }
  uint64_t MetadataBytes() const override {
    return uint64_t{arena_->total_pages()} * sizeof(uint32_t) + arena_->SegmentsAheadBytes() + slots_.MetadataBytes();
  }
  uint64_t SlackBytes() const override { return arena_->SlackPages() * arena_->page_size(); }
  uint64_t SlackBytesOf(const std::string& owner) const override {
    return arena_->SlackPagesOf(owner) * arena_->page_size() + slots_.FreeBytesOf(owner);
  }
  uint64_t SegmentBytes() const override { return uint64_t{arena_->segment_pages()} * arena_->page_size(); }

 protected:
  uint32_t PagesFor(size_t bytes) const {
    return static_cast<uint32_t>((bytes + arena_->page_size() - 1) / arena_->page_size());
  }
  const std::unique_ptr<PageArena> arena_;
  RecordSlots slots_;
};

// Pages in memfd segments, each of one segment owner (a group of
// namespaces and a tenant), mapped read-only by same-host readers.
class SharedSegments final : public PrivatePages {
 public:
  using PrivatePages::PrivatePages;

  bool shareable() const override { return true; }

  std::vector<SharedPiece> SharedPieces(uint32_t tier, const RecordRoom& room) const override {
    const uint64_t segment_bytes = uint64_t{arena_->segment_pages()} * arena_->page_size();
    std::vector<SharedPiece> pieces;
    size_t left = room.size;
    const uint32_t slot = RecordSlots::Offset(room.pages);  // a slotted record lies in one page
    for (uint32_t p : RecordSlots::Pages(room.pages)) {
      const uint32_t s = arena_->SegmentOf(p);
      if (arena_->SegmentFd(s) < 0) return {};  // anonymous memory stood in for its memfd
      const uint64_t offset = uint64_t{p} * arena_->page_size() + slot - s * segment_bytes;
      const uint64_t n = std::min<size_t>(left, arena_->page_size() - slot);
      left -= n;
      SharedPiece* last = pieces.empty() ? nullptr : &pieces.back();
      if (last != nullptr && last->segment == s && last->offset + last->length == offset) {
        last->length += n;
        continue;
      }
      pieces.push_back({tier, s, arena_->Generation(s), offset, n});
    }
    return pieces;
  }

  absl::StatusOr<int> OpenShared(uint32_t segment, uint64_t generation, const std::string& group) override {
    if (segment >= arena_->segment_count()) {
      return absl::InvalidArgumentError(absl::StrCat("no shared segment ", segment));
    }
    if (arena_->Generation(segment) != generation || !arena_->Ready(segment) || arena_->SegmentFd(segment) < 0) {
      return absl::FailedPreconditionError(absl::StrCat("segment ", segment, " is no longer generation ", generation));
    }
    if (SegmentOwnerGroup(arena_->Owner(segment)) != group) {
      return absl::PermissionDeniedError(
          absl::StrCat("segment ", segment, " holds blocks of namespaces this reader may not read"));
    }
    // Reopening through /proc gives a descriptor of the same memory that can
    // only be mapped read-only.
    const std::string path = absl::StrCat("/proc/self/fd/", arena_->SegmentFd(segment));
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::InternalError(absl::StrCat("cannot reopen ", path, ": ", std::strerror(errno)));
    arena_->MarkExported(segment);  // from now on, it changes owner through a new memfd
    return fd;
  }
};

// Pages in a slab reached only by copies (a GPU's memory).
class SlabPages final : public PrivatePages {
 public:
  SlabPages(std::unique_ptr<PageArena> arena, SlabMemory* slab) : PrivatePages(std::move(arena)), slab_(slab) {}

  absl::StatusOr<RecordBytes> Read(const RecordRoom& room) const override {
    std::shared_ptr<uint8_t> copy = slab_->AllocateHost(room.size);
    std::vector<std::span<uint8_t>> out{std::span(copy.get(), room.size)};
    std::optional<uint32_t> crc;
    const absl::Status read = ReadInto(std::span(&room, 1), std::span(&out, 1), std::span(&crc, 1))[0];
    if (!read.ok()) return read;
    RecordBytes bytes;
    bytes.pieces.emplace_back(copy.get(), room.size);
    bytes.owned = std::move(copy);
    bytes.crc = crc;
    return bytes;
  }
  std::vector<absl::Status> ReadInto(std::span<const RecordRoom> rooms,
                                     std::span<const std::vector<std::span<uint8_t>>> to,
                                     std::span<std::optional<uint32_t>> crcs) const override {
    // All in one batch of copies (one wait); a GPU computes the records'
    // CRCs where they lie, at its memory's rate.
    std::vector<PageArena::RecordPieces> records;
    for (size_t k = 0; k < rooms.size(); ++k) {
      records.push_back({RecordSlots::Pages(rooms[k].pages), RecordSlots::Offset(rooms[k].pages), to[k],
                         rooms[k].size - kvblock::kBlockTrailerBytes});
    }
    return std::vector<absl::Status>(rooms.size(), arena_->ReadRecords(records, crcs));
  }
  std::vector<std::span<uint8_t>> Memory(const RecordRoom& /*room*/) const override { return {}; }

  bool in_memory() const override { return false; }
  uint64_t MoveBatchBytes(uint64_t capacity) const override {
    // More than one block a batch leaves room ahead for the next; at most a
    // sixteenth of the tier.
    constexpr uint64_t kBatchBytes = 8 << 20;
    return std::min<uint64_t>(kBatchBytes, capacity / 16);
  }
  SlabMemory* slab() const override { return slab_; }

  absl::Status CopyToExported(std::span<const ToExport> records, ExportedBuffer& to) const override {
    std::vector<PageArena::RecordExport> exports;
    for (const ToExport& r : records) {
      exports.push_back({RecordSlots::Pages(r.room.pages), RecordSlots::Offset(r.room.pages), r.room.size, r.at});
    }
    return arena_->CopyToExported(exports, to);
  }

 private:
  SlabMemory* const slab_;  // the arena's
};

// One file per record.
class DiskFiles final : public TierStorage {
 public:
  DiskFiles(std::unique_ptr<DiskDir> disk, uint64_t capacity) : disk_(std::move(disk)), capacity_(capacity) {}

  bool Fits(size_t bytes) const override { return bytes <= capacity_; }
  bool HasRoom(size_t bytes, const std::string& /*owner*/, uint64_t free_bytes) const override {
    return free_bytes >= bytes;
  }
  bool Take(size_t /*bytes*/, const std::string& /*owner*/, std::vector<uint32_t>& /*pages*/) override { return true; }
  void Give(const RecordRoom& room, bool written) override {
    if (written) disk_->Remove(room.ns, room.hash);
  }

  absl::StatusOr<RecordBytes> Read(const RecordRoom& room) const override {
    absl::StatusOr<std::string> file = disk_->Read(room.ns, room.hash, room.size);
    if (!file.ok()) return file.status();
    auto held = std::make_shared<std::string>(*std::move(file));
    RecordBytes bytes;
    bytes.owned = std::shared_ptr<const uint8_t>(held, reinterpret_cast<const uint8_t*>(held->data()));
    bytes.pieces.emplace_back(bytes.owned.get(), room.size);
    return bytes;
  }
  absl::Status Write(const RecordRoom& room, const std::vector<std::span<const uint8_t>>& pieces) const override {
    return disk_->Write(room.ns, room.hash, room.owner, pieces);
  }
  std::vector<DiskRecord> Recover(uint64_t& corrupt) override { return disk_->Scan(corrupt); }
  void OrderForRestart(std::span<const RecordRoom> oldest_first) const override {
    // Scan orders by modification time: a microsecond apart from now on,
    // later than every file written before.
    const absl::Time now = absl::Now();
    for (size_t i = 0; i < oldest_first.size(); ++i) {
      disk_->SetModified(oldest_first[i].ns, oldest_first[i].hash, now + absl::Microseconds(static_cast<int64_t>(i)));
    }
  }

 private:
  const std::unique_ptr<DiskDir> disk_;
  const uint64_t capacity_;
};

}  // namespace

std::unique_ptr<TierStorage> PagesStorage(std::unique_ptr<PageArena> arena) {
  if (SlabMemory* slab = const_cast<SlabMemory*>(arena->slab())) {
    return std::make_unique<SlabPages>(std::move(arena), slab);
  }
  if (arena->shared()) return std::make_unique<SharedSegments>(std::move(arena));
  return std::make_unique<PrivatePages>(std::move(arena));
}

std::unique_ptr<TierStorage> DiskStorage(std::unique_ptr<DiskDir> disk, uint64_t capacity) {
  return std::make_unique<DiskFiles>(std::move(disk), capacity);
}

}  // namespace kvtier::cache
