#include "services/cache/block_store.h"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "services/common/status.h"
#include "services/kvblock/block_format.h"
#include "services/common/log.h"
#include "services/kvblock/crc32c.h"

namespace kvtier::cache {

struct Entry {
  std::string ns;
  kvblock::BlockHash hash;
  uint64_t layout_id = 0;
  size_t size = 0;  // record bytes
  size_t tier = 0;
  std::vector<uint32_t> pages;
  uint32_t pins = 0;
  bool zombie = false;  // dropped while pinned; pages freed at the last unpin
  bool moving = false;  // being copied to another tier (without the lock)
  std::list<Entry*>::iterator lru;
};

struct BlockStore::Tier {
  // Exactly one of these; neither pointer changes after Create.
  std::unique_ptr<PageArena> arena;
  std::unique_ptr<DiskDir> disk;
  std::list<Entry*> lru;  // most recently used first
  TierCounters counters;
};

struct BlockStore::Lease {
  absl::Time deadline;
  std::vector<Entry*> entries;
};

namespace {

// Bookkeeping bytes an index entry costs beyond its payload: the entry, its
// page list, its namespace copy and the hash-map node.
size_t EntryMetadataBytes(const Entry& e) {
  constexpr size_t kMapNode = 64;
  return sizeof(Entry) + kMapNode + e.pages.capacity() * sizeof(uint32_t) + e.ns.capacity();
}

// CRC32C of a paged record's bytes before its trailer, and the stored one.
uint32_t ComputedCrc(const std::vector<std::span<const uint8_t>>& pieces, size_t size) {
  uint32_t crc = 0;
  size_t left = size - kvblock::kBlockTrailerBytes;
  for (const auto& piece : pieces) {
    const size_t n = std::min(left, piece.size());
    crc = kvblock::Crc32cExtend(crc, piece.data(), n);
    left -= n;
    if (left == 0) break;
  }
  return crc;
}

// Copies [offset, offset + out.size()) of a paged record into `out`.
void ReadAt(const std::vector<std::span<const uint8_t>>& pieces, size_t offset,
            std::span<uint8_t> out) {
  for (const auto& piece : pieces) {
    if (out.empty()) return;
    if (offset >= piece.size()) {
      offset -= piece.size();
      continue;
    }
    const size_t n = std::min(out.size(), piece.size() - offset);
    std::memcpy(out.data(), piece.data() + offset, n);
    out = out.subspan(n);
    offset = 0;
  }
}

uint32_t StoredCrc(const std::vector<std::span<const uint8_t>>& pieces, size_t size) {
  uint32_t crc = 0;
  ReadAt(pieces, size - kvblock::kBlockTrailerBytes,
         std::span(reinterpret_cast<uint8_t*>(&crc), sizeof crc));
  return crc;
}

// A slab's own CRC of a record (a GPU's) that the landed copy's check
// overruled: every such record is then checked twice.
void WarnSlabCrcDisagreed(const kvblock::BlockHash& hash) {
  static RateLimitedLog log(LogLevel::kWarning, "store");
  log(absl::StrCat("the device tier's CRC of block ", kvblock::HashToHex(hash),
                   " disagreed with the check of its copy, which passed; such blocks are checked on the host"));
}

// Whether a record copied out of its tier is intact: by the CRC its slab
// computed where it lay (a GPU's) when that agrees with the landed
// trailer; else by checking the copy here, which decides.
bool Intact(const std::vector<std::span<const uint8_t>>& landed, size_t size, std::optional<uint32_t> slab_crc,
            const kvblock::BlockHash& hash) {
  const uint32_t stored = StoredCrc(landed, size);
  if (slab_crc.has_value() && *slab_crc == stored) return true;
  const bool intact = ComputedCrc(landed, size) == stored;
  if (intact && slab_crc.has_value()) WarnSlabCrcDisagreed(hash);
  return intact;
}

// A tier move whose copy failed (not a checksum: the copying itself, a
// GPU's error say): the block stays where it was, or is dropped when its
// room is needed.
void WarnMoveFailed(const absl::Status& copied) {
  static RateLimitedLog log(LogLevel::kWarning, "store");
  log(absl::StrCat("a tier move failed (", copied.ToString(),
                   "); such blocks stay in their tier, or are evicted when their room is needed"));
}

absl::Status ChecksumFailed(const kvblock::BlockHash& hash) {
  return absl::DataLossError(absl::StrCat("block ", kvblock::HashToHex(hash), " failed its checksum"));
}

}  // namespace

size_t BlockStore::KeyHash::operator()(const Key& k) const {
  uint64_t h;
  std::memcpy(&h, k.second.data(), sizeof h);  // already uniformly distributed
  return h ^ std::hash<std::string>()(k.first);
}

// ---- PinnedBlock ----

PinnedBlock::PinnedBlock(BlockStore* store, Entry* entry, v1::Tier tier,
                         std::vector<std::span<const uint8_t>> pieces, std::shared_ptr<const uint8_t> owned,
                         size_t size)
    : store_(store), entry_(entry), tier_(tier), owned_(std::move(owned)), pieces_(std::move(pieces)), size_(size) {}

PinnedBlock::~PinnedBlock() { store_->Unpin(entry_); }

std::string PinnedBlock::CopyToString() const {
  std::string out;
  out.reserve(size_);
  for (const auto& piece : pieces_) out.append(reinterpret_cast<const char*>(piece.data()), piece.size());
  return out;
}

// ---- BlockStore ----

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Create(const StoreOptions& options,
                                                               Clock* clock) {
  if (options.page_size < 4096) {
    return absl::InvalidArgumentError("page size must be at least 4096 bytes");
  }
  std::vector<std::unique_ptr<Tier>> tiers;
  const std::pair<v1::Tier, uint64_t> configured[] = {
      {v1::TIER_DEVICE, options.device_capacity}, {v1::TIER_HOST, options.host_capacity}};
  for (auto [kind, capacity] : configured) {
    if (capacity < options.page_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          v1::Tier_Name(kind), " capacity ", capacity, " bytes is below one page (",
          options.page_size, " bytes)"));
    }
    ArenaOptions arena_options;
    arena_options.capacity = capacity;
    arena_options.page_size = options.page_size;
    arena_options.segment_pages =
        static_cast<uint32_t>(std::max<uint64_t>(1, options.segment_bytes / options.page_size));
    arena_options.shared = options.shared_memory;
    arena_options.make_segments_ahead = options.make_segments_ahead;
    if (kind == v1::TIER_DEVICE) arena_options.slab = options.device_slab;
    if (kind == v1::TIER_HOST) arena_options.pin_for = options.device_slab;  // tier moves copy between them
    auto arena = PageArena::Create(arena_options);
    if (!arena.ok()) return arena.status();
    auto tier = std::make_unique<Tier>();
    tier->arena = std::move(*arena);
    tier->counters.tier = kind;
    tier->counters.capacity_bytes = capacity;
    tiers.push_back(std::move(tier));
  }
  if (options.disk_dir.empty() != (options.disk_capacity == 0)) {
    return absl::InvalidArgumentError("a disk tier needs both a directory and a capacity");
  }
  if (!options.disk_dir.empty()) {
    absl::StatusOr<std::unique_ptr<DiskDir>> disk = DiskDir::Open(options.disk_dir);
    if (!disk.ok()) return disk.status();
    auto tier = std::make_unique<Tier>();
    tier->disk = *std::move(disk);
    tier->counters.tier = v1::TIER_DISK;
    tier->counters.capacity_bytes = options.disk_capacity;
    tiers.push_back(std::move(tier));
  }
  std::unique_ptr<BlockStore> store(new BlockStore(options, clock, std::move(tiers)));
  absl::MutexLock lock(&store->mu_);
  store->LoadDiskLocked();
  return store;
}

void BlockStore::LoadDiskLocked() {
  Tier& t = *tiers_.back();
  if (t.disk == nullptr) return;
  std::vector<DiskRecord> records = t.disk->Scan(counters_.checksum_failures);
  // Newest first, so the LRU list's back is the oldest file.
  std::sort(records.begin(), records.end(),
            [](const DiskRecord& a, const DiskRecord& b) { return a.mtime_ns > b.mtime_ns; });
  for (DiskRecord& r : records) {
    if (t.counters.used_bytes + r.size > t.counters.capacity_bytes) {  // capacity shrank
      t.disk->Remove(r.ns, r.hash);
      ++t.counters.evictions;
      continue;
    }
    auto entry = std::make_unique<Entry>();
    entry->ns = std::move(r.ns);
    entry->hash = r.hash;
    entry->layout_id = r.layout_id;
    entry->size = r.size;
    entry->tier = tiers_.size() - 1;
    t.lru.push_back(entry.get());
    entry->lru = std::prev(t.lru.end());
    t.counters.used_bytes += r.size;
    ++t.counters.blocks;
    counters_.metadata_bytes += EntryMetadataBytes(*entry);
    Key key(entry->ns, entry->hash);
    index_.emplace(std::move(key), std::move(entry));
  }
}

BlockStore::BlockStore(const StoreOptions& options, Clock* clock,
                       std::vector<std::unique_ptr<Tier>> tiers)
    : options_(options), clock_(clock), tiers_(std::move(tiers)) {}

BlockStore::~BlockStore() = default;

uint32_t BlockStore::PagesFor(size_t bytes) const {
  return static_cast<uint32_t>((bytes + options_.page_size - 1) / options_.page_size);
}

MatchResult BlockStore::Match(const std::string& ns, uint64_t layout_id,
                              std::span<const kvblock::BlockHash> hashes,
                              std::optional<absl::Duration> lease_ttl) {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  MatchResult result;
  std::vector<Entry*> matched;
  for (const kvblock::BlockHash& hash : hashes) {
    auto it = index_.find(Key(ns, hash));
    if (it == index_.end() || it->second->layout_id != layout_id) break;
    Entry* e = it->second.get();
    TouchLocked(e);
    matched.push_back(e);
    result.tiers.push_back(tiers_[e->tier]->counters.tier);
  }
  result.matched_blocks = static_cast<uint32_t>(matched.size());
  if (lease_ttl.has_value() && !matched.empty()) {
    absl::Duration ttl = *lease_ttl <= absl::ZeroDuration() ? options_.default_lease_ttl : *lease_ttl;
    ttl = std::min(ttl, options_.max_lease_ttl);
    for (Entry* e : matched) PinLocked(e);
    result.lease_id = next_lease_id_++;
    result.lease_deadline = clock_->Now() + ttl;
    leases_[result.lease_id] = Lease{result.lease_deadline, std::move(matched)};
  }
  return result;
}

absl::Status BlockStore::ReleaseLease(uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " is unknown or expired"));
  }
  for (Entry* e : it->second.entries) UnpinLocked(e);
  leases_.erase(it);
  return absl::OkStatus();
}

void BlockStore::ExpireLeases() {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
}

void BlockStore::ExpireLeasesLocked() {
  const absl::Time now = clock_->Now();
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    for (Entry* e : it->second.entries) UnpinLocked(e);
    leases_.erase(it++);
  }
}

absl::StatusOr<std::shared_ptr<const PinnedBlock>> BlockStore::Read(
    const std::string& ns, uint64_t layout_id, const kvblock::BlockHash& hash, const ReadOptions& options) {
  Entry* e;
  size_t tier;
  std::vector<uint32_t> pages;
  v1::Tier served_from;
  {
    absl::MutexLock lock(&mu_);
    ExpireLeasesLocked();
    auto it = index_.find(Key(ns, hash));
    if (it == index_.end()) {
      ++counters_.misses;
      return absl::NotFoundError(absl::StrCat("block ", kvblock::HashToHex(hash), " not stored"));
    }
    e = it->second.get();
    if (e->layout_id != layout_id) {
      return absl::FailedPreconditionError(
          absl::StrCat("block ", kvblock::HashToHex(hash), " was stored under layout ",
                       absl::Hex(e->layout_id), ", not ", absl::Hex(layout_id)));
    }
    Tier& from = *tiers_[e->tier];
    ++from.counters.hits;
    served_from = from.counters.tier;
    PinLocked(e);  // before the move: making room must not pick this block
    if (e->tier != 0 && options.promote && !MoveLocked(std::span(&e, 1), 0)[0] && e->zombie) {
      UnpinLocked(e);
      return absl::DataLossError(absl::StrCat("block ", kvblock::HashToHex(hash),
                                              " failed its checksum and was dropped"));
    }
    TouchLocked(e);
    // Promotion can fail only when the device tier is all pinned; then the
    // block is served from where it is.
    tier = e->tier;
    pages = e->pages;
  }
  // Pinned, with a reader's pin no move commits: its storage stays as it
  // is, so it is read (a file, a copy out of a slab) and verified without
  // the lock.
  std::vector<std::span<const uint8_t>> pieces;
  std::shared_ptr<const uint8_t> owned;  // the record, when copied from disk or a slab
  std::optional<uint32_t> slab_crc;
  const PageArena* arena = tiers_[tier]->arena.get();
  const bool in_place = !options.copy_out && (arena == nullptr || !arena->addressable());
  if (!in_place) {
    absl::StatusOr<std::vector<std::span<const uint8_t>>> source =
        SourceOf(tier, pages, ns, hash, e->size, owned, slab_crc);
    if (source.ok()) pieces = std::move(*source);
  }
  if (!in_place && (pieces.empty() || (options.verify_checksum && !Intact(pieces, e->size, slab_crc, hash)))) {
    absl::MutexLock lock(&mu_);
    ++counters_.checksum_failures;
    if (!e->zombie) DropLocked(e);
    UnpinLocked(e);
    return absl::DataLossError(absl::StrCat("block ", kvblock::HashToHex(hash),
                                            " failed its checksum and was dropped"));
  }
  if (!in_place) {  // a block pinned unread is counted by whoever reads it
    absl::MutexLock lock(&mu_);
    counters_.bytes_out += e->size;
  }
  return std::shared_ptr<const PinnedBlock>(
      new PinnedBlock(this, e, served_from, std::move(pieces), std::move(owned), e->size));
}

void BlockStore::Unpin(Entry* entry) {
  absl::MutexLock lock(&mu_);
  UnpinLocked(entry);
}

void BlockStore::UnpinLocked(Entry* e) {
  if (--e->pins > 0) return;
  --counters_.pinned_blocks;
  if (!e->zombie) return;
  ReleaseStorageLocked(*e);
  counters_.metadata_bytes -= EntryMetadataBytes(*e);
  auto it = std::find_if(zombies_.begin(), zombies_.end(),
                         [e](const std::unique_ptr<Entry>& z) { return z.get() == e; });
  zombies_.erase(it);
}

void BlockStore::PinLocked(Entry* e) {
  if (e->pins++ == 0) ++counters_.pinned_blocks;
}

void BlockStore::TouchLocked(Entry* e) {
  auto& lru = tiers_[e->tier]->lru;
  lru.splice(lru.begin(), lru, e->lru);
}

void BlockStore::FreePagesLocked(size_t tier, const std::vector<uint32_t>& pages, size_t bytes) {
  Tier& t = *tiers_[tier];
  t.arena->Free(pages);
  t.counters.used_bytes -= bytes;
}

void BlockStore::ReleaseStorageLocked(const Entry& e) {
  Tier& t = *tiers_[e.tier];
  if (t.disk != nullptr) {
    t.disk->Remove(e.ns, e.hash);
    t.counters.used_bytes -= e.size;
  } else {
    FreePagesLocked(e.tier, e.pages, e.size);
  }
}

absl::StatusOr<std::vector<std::span<const uint8_t>>> BlockStore::SourceOf(
    size_t tier, const std::vector<uint32_t>& pages, const std::string& ns, const kvblock::BlockHash& hash,
    size_t size, std::shared_ptr<const uint8_t>& owned, std::optional<uint32_t>& slab_crc) const {
  const Tier& t = *tiers_[tier];
  std::vector<std::span<const uint8_t>> pieces;
  if (t.disk == nullptr && t.arena->addressable()) {
    for (std::span<uint8_t> piece : t.arena->PagePieces(pages, size)) pieces.emplace_back(piece);
    return pieces;
  }
  if (t.disk != nullptr) {
    absl::StatusOr<std::string> bytes = t.disk->Read(ns, hash, size);
    if (!bytes.ok()) return bytes.status();
    if (bytes->size() != size) return absl::DataLossError("record file changed size");
    auto held = std::make_shared<std::string>(*std::move(bytes));
    owned = std::shared_ptr<const uint8_t>(held, reinterpret_cast<const uint8_t*>(held->data()));
  } else {
    std::shared_ptr<uint8_t> copy = t.arena->slab()->AllocateHost(size);
    const std::span<uint8_t> out(copy.get(), size);
    const PageArena::RecordPieces record{&pages, 0, std::span(&out, 1), size - kvblock::kBlockTrailerBytes};
    KVTIER_RETURN_IF_ERROR(t.arena->ReadRecords(std::span(&record, 1), std::span(&slab_crc, 1)));
    owned = std::move(copy);
  }
  return std::vector<std::span<const uint8_t>>{std::span(owned.get(), size)};
}

bool BlockStore::HasRoomLocked(size_t tier, size_t bytes, const std::string& ns) const {
  const Tier& t = *tiers_[tier];
  if (t.disk != nullptr) return t.counters.capacity_bytes - t.counters.used_bytes >= bytes;
  return t.arena->FreePagesFor(ns) >= PagesFor(bytes);
}

void BlockStore::DropLocked(Entry* e) {
  Tier& t = *tiers_[e->tier];
  t.lru.erase(e->lru);
  --t.counters.blocks;
  auto it = index_.find(Key(e->ns, e->hash));
  std::unique_ptr<Entry> owned = std::move(it->second);
  index_.erase(it);
  if (e->pins > 0) {
    e->zombie = true;
    zombies_.push_back(std::move(owned));
    return;
  }
  ReleaseStorageLocked(*e);
  counters_.metadata_bytes -= EntryMetadataBytes(*e);
}

uint64_t BlockStore::DemotionBatchBytes(size_t tier) const {
  const Tier& t = *tiers_[tier];
  if (tier + 1 == tiers_.size() || t.arena == nullptr || t.arena->addressable()) return 0;
  return std::min<uint64_t>(kDemotionBatchBytes, t.counters.capacity_bytes / 16);
}

bool BlockStore::MakeRoomLocked(size_t tier, size_t bytes, const std::string& ns) {
  Tier& t = *tiers_[tier];
  const bool demotes = tier + 1 < tiers_.size();
  // Victims taken at a time: a batch to demote, or the one to evict.
  const uint64_t victims_bytes = demotes ? std::max<uint64_t>(bytes, DemotionBatchBytes(tier)) : 1;
  // Plain LRU: in a shared arena another namespace's victim makes room only
  // once its segment empties, so this may move more than `bytes`.
  while (!HasRoomLocked(tier, bytes, ns)) {
    std::vector<Entry*> victims;  // least recently used first
    uint64_t victim_bytes = 0;
    for (auto it = t.lru.rbegin(); it != t.lru.rend() && victim_bytes < victims_bytes; ++it) {
      if ((*it)->pins > 0) continue;
      victims.push_back(*it);
      victim_bytes += (*it)->size;
    }
    if (victims.empty()) return false;
    if (!demotes) {
      ++t.counters.evictions;
      DropLocked(victims[0]);
      continue;
    }
    for (Entry* v : victims) PinLocked(v);  // keeps them out of the next tier's own eviction
    const std::vector<bool> moved = MoveLocked(victims, tier + 1);
    for (size_t i = 0; i < victims.size(); ++i) {
      Entry* v = victims[i];
      const bool dropped = v->zombie;
      const bool read_meanwhile = v->pins > 1;  // the copy ran unlocked: look for another
      UnpinLocked(v);
      // One that could not go down is dropped, if its room is still needed.
      if (moved[i] || dropped || read_meanwhile || HasRoomLocked(tier, bytes, ns)) continue;
      ++t.counters.evictions;
      DropLocked(v);
    }
  }
  return true;
}

struct BlockStore::Move {
  size_t index;  // in MoveLocked's entries
  Entry* entry;
  size_t from;
  std::vector<uint32_t> source;  // its pages where it is
  std::vector<uint32_t> pages;   // its room in the destination
};

std::vector<bool> BlockStore::MoveLocked(std::span<Entry* const> entries, size_t to) {
  // The caller holds the entries pinned: nothing frees their storage or
  // evicts them, and `moving` keeps a second mover away, so their bytes
  // stay put while the copies below run without the lock. Only a block no
  // one else reads moves (another reader's pieces point into its storage);
  // the same is checked again before a move commits.
  std::vector<bool> moved(entries.size(), false);
  Tier& dst = *tiers_[to];
  std::vector<size_t> wanted(entries.size());
  for (size_t i = 0; i < wanted.size(); ++i) wanted[i] = i;
  // A second round for the blocks a full file system refused, once the
  // disk tier has evicted to make room there.
  for (int round = 0; round < 2 && !wanted.empty(); ++round) {
    std::vector<Move> moves;
    for (size_t i : wanted) {
      Entry* e = entries[i];
      if (e->moving || e->pins > 1 || e->zombie) continue;
      const bool fits_at_all = dst.disk != nullptr ? e->size <= dst.counters.capacity_bytes
                                                   : PagesFor(e->size) <= dst.arena->total_pages();
      if (!fits_at_all || !MakeRoomLocked(to, e->size, e->ns)) continue;
      std::vector<uint32_t> pages;  // the room, reserved
      if (dst.disk == nullptr && !dst.arena->Allocate(PagesFor(e->size), e->ns, pages)) continue;
      dst.counters.used_bytes += e->size;
      e->moving = true;
      moves.push_back({i, e, e->tier, e->pages, std::move(pages)});
    }
    if (moves.empty()) break;
    // Copying (and checking) blocks takes long enough that other calls
    // should not wait for it.
    mu_.Unlock();
    const std::vector<absl::Status> copied = CopyRecords(moves, to);
    mu_.Lock();
    wanted.clear();
    for (size_t k = 0; k < moves.size(); ++k) {
      moved[moves[k].index] = FinishMoveLocked(moves[k], to, copied[k]);
      if (!moved[moves[k].index] && copied[k].code() == absl::StatusCode::kResourceExhausted &&
          dst.disk != nullptr && MakeDiskRoomLocked(to, moves[k].entry->size)) {
        wanted.push_back(moves[k].index);
      }
    }
  }
  return moved;
}

bool BlockStore::MakeDiskRoomLocked(size_t tier, size_t bytes) {
  static RateLimitedLog log(LogLevel::kWarning, "disk");
  Tier& t = *tiers_[tier];
  std::vector<Entry*> victims;  // least recently used first
  size_t freed = 0;
  for (auto it = t.lru.rbegin(); it != t.lru.rend() && freed < bytes; ++it) {
    if ((*it)->pins > 0 || (*it)->moving) continue;
    victims.push_back(*it);
    freed += (*it)->size;
  }
  for (Entry* victim : victims) {
    ++t.counters.evictions;
    DropLocked(victim);
  }
  log(absl::StrCat("the file system under the disk tier is full before its capacity (", t.counters.used_bytes,
                   " of ", t.counters.capacity_bytes, " bytes in use); evicted ", victims.size(),
                   " blocks to make room"));
  return !victims.empty();
}

bool BlockStore::FinishMoveLocked(Move& move, size_t to, const absl::Status& copied) {
  Entry* e = move.entry;
  const size_t from = move.from;
  Tier& dst = *tiers_[to];
  std::vector<uint32_t>& pages = move.pages;
  e->moving = false;
  // A reader that pinned the block meanwhile reads its old storage: it stays.
  if (!copied.ok() || e->zombie || e->pins > 1) {
    if (dst.disk == nullptr) {
      dst.arena->Free(pages);
    } else if (copied.ok() && !(e->zombie && index_.count(Key(e->ns, e->hash)) > 0)) {
      dst.disk->Remove(e->ns, e->hash);  // ours (a newer block of that key keeps its file)
    } else if (!copied.ok() && copied.code() != absl::StatusCode::kDataLoss) {
      ++counters_.disk_write_errors;
    }
    dst.counters.used_bytes -= e->size;
    if (copied.code() == absl::StatusCode::kDataLoss) {  // a corrupt record never reaches another tier
      ++counters_.checksum_failures;
      if (!e->zombie) DropLocked(e);
    } else if (!copied.ok()) {
      WarnMoveFailed(copied);
    }
    return false;
  }
  Tier& src = *tiers_[from];
  src.lru.erase(e->lru);
  --src.counters.blocks;
  ReleaseStorageLocked(*e);
  e->pages = std::move(pages);
  e->tier = to;
  dst.lru.push_front(e);
  e->lru = dst.lru.begin();
  ++dst.counters.blocks;
  if (to < from) {
    ++dst.counters.promotions;
  } else {
    ++src.counters.demotions;
  }
  return true;
}

std::vector<absl::Status> BlockStore::CopyRecords(std::span<const Move> moves, size_t to) const {
  std::vector<absl::Status> copied;
  const Tier& src = *tiers_[moves[0].from];  // the same for all
  const Tier& dst = *tiers_[to];
  if (src.disk == nullptr && !src.arena->addressable() && dst.disk == nullptr) {
    // Out of a slab (a GPU's): straight into the destination's pages, all
    // in one batch of copies (one wait); a GPU computes the records' CRCs
    // where they lie, at its memory's rate (Intact).
    std::vector<std::vector<std::span<uint8_t>>> outs;
    for (const Move& m : moves) outs.push_back(dst.arena->PagePieces(m.pages, m.entry->size));
    std::vector<PageArena::RecordPieces> records;
    for (size_t k = 0; k < moves.size(); ++k) {
      records.push_back({&moves[k].source, 0, outs[k], moves[k].entry->size - kvblock::kBlockTrailerBytes});
    }
    std::vector<std::optional<uint32_t>> slab_crcs(moves.size());
    const absl::Status read = src.arena->ReadRecords(records, slab_crcs);
    if (!read.ok()) return std::vector<absl::Status>(moves.size(), read);
    for (size_t k = 0; k < moves.size(); ++k) {
      const Entry& e = *moves[k].entry;
      const std::vector<std::span<const uint8_t>> landed(outs[k].begin(), outs[k].end());
      copied.push_back(Intact(landed, e.size, slab_crcs[k], e.hash) ? absl::OkStatus() : ChecksumFailed(e.hash));
    }
    return copied;
  }
  for (const Move& m : moves) {
    copied.push_back(CopyRecord(m.from, m.source, to, m.pages, m.entry->ns, m.entry->hash, m.entry->size));
  }
  return copied;
}

absl::Status BlockStore::CopyRecord(size_t from, const std::vector<uint32_t>& source, size_t to,
                                    const std::vector<uint32_t>& pages, const std::string& ns,
                                    const kvblock::BlockHash& hash, size_t size) const {
  std::shared_ptr<const uint8_t> owned;
  std::optional<uint32_t> slab_crc;
  absl::StatusOr<std::vector<std::span<const uint8_t>>> pieces =
      SourceOf(from, source, ns, hash, size, owned, slab_crc);
  if (!pieces.ok() || !Intact(*pieces, size, slab_crc, hash)) return ChecksumFailed(hash);
  const Tier& dst = *tiers_[to];
  if (dst.disk != nullptr) return dst.disk->Write(ns, hash, *pieces);  // disk full or failing: stays
  return dst.arena->WritePieces(pages, 0, *pieces);  // into a slab: one batch of copies
}

absl::StatusOr<std::vector<uint32_t>> BlockStore::AllocatePendingLocked(size_t bytes,
                                                                      const std::string& ns) {
  if (pending_blocks_ >= options_.max_pending_blocks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        pending_blocks_, " blocks are being assembled, the limit; retry later"));
  }
  Tier& first = *tiers_[0];
  const uint32_t n = PagesFor(bytes);
  if (n > first.arena->total_pages()) {
    return absl::ResourceExhaustedError(absl::StrCat("a block of ", bytes,
                                                     " bytes does not fit the device tier (",
                                                     first.counters.capacity_bytes, " bytes)"));
  }
  if (!MakeRoomLocked(0, bytes, ns)) {
    return absl::ResourceExhaustedError(
        "device tier is full of pinned or incomplete blocks; retry later");
  }
  std::vector<uint32_t> pages;
  if (!first.arena->Allocate(n, ns, pages)) {
    return absl::ResourceExhaustedError("device tier is full of blocks in use; retry later");
  }
  first.counters.used_bytes += bytes;
  ++pending_blocks_;
  return pages;
}

std::unique_ptr<PutSession> BlockStore::BeginPut(std::string ns, kvblock::LatentLayout layout) {
  return std::unique_ptr<PutSession>(new PutSession(this, std::move(ns), std::move(layout)));
}

bool BlockStore::Shareable(size_t tier) const {
  return tier < tiers_.size() && tiers_[tier]->arena != nullptr && tiers_[tier]->arena->shared();
}

SlabMemory* BlockStore::FirstTierSlab() const { return options_.device_slab.get(); }

absl::Status BlockStore::CopyToExported(const PinnedBlock& block, ExportedBuffer& to, uint64_t at) {
  size_t tier;
  std::vector<uint32_t> pages;
  size_t size;
  {
    absl::MutexLock lock(&mu_);
    tier = block.entry_->tier;
    pages = block.entry_->pages;
    size = block.entry_->size;
  }
  // Pinned: its pages stay as they are without the lock.
  const PageArena* arena = tiers_[tier]->arena.get();
  if (arena == nullptr || arena->addressable() || block.owned_ != nullptr) {
    return absl::FailedPreconditionError("block is not in a slab tier");
  }
  SlabMemory* slab = options_.device_slab.get();  // the one slab tier's
  const size_t page = arena->page_size();
  for (size_t k = 0; k < pages.size() && k * page < size; ++k) {
    const size_t n = std::min(page, size - k * page);
    KVTIER_RETURN_IF_ERROR(slab->CopyToExported(size_t{pages[k]} * page, to, at + k * page, n));
  }
  return absl::OkStatus();
}

std::vector<SharedPiece> BlockStore::SharedPieces(const PinnedBlock& block) {
  absl::MutexLock lock(&mu_);
  const Entry& e = *block.entry_;
  const Tier& t = *tiers_[e.tier];
  std::vector<SharedPiece> pieces;
  if (block.owned_ != nullptr || t.arena == nullptr || !t.arena->shared()) return pieces;
  const PageArena& arena = *t.arena;
  const uint64_t segment_bytes = uint64_t{arena.segment_pages()} * arena.page_size();
  size_t left = e.size;
  for (uint32_t p : e.pages) {
    const uint32_t s = arena.SegmentOf(p);
    if (arena.SegmentFd(s) < 0) return {};
    const uint64_t offset = uint64_t{p} * arena.page_size() - s * segment_bytes;
    const uint64_t n = std::min<size_t>(left, arena.page_size());
    left -= n;
    SharedPiece* last = pieces.empty() ? nullptr : &pieces.back();
    if (last != nullptr && last->segment == s && last->offset + last->length == offset) {
      last->length += n;
      continue;
    }
    pieces.push_back({static_cast<uint32_t>(e.tier), s, arena.Generation(s), offset, n});
  }
  return pieces;
}

absl::StatusOr<int> BlockStore::OpenSegmentReadOnly(uint32_t tier, uint32_t segment,
                                                    uint64_t generation, const std::string& ns) {
  absl::MutexLock lock(&mu_);
  PageArena* arena = tier < tiers_.size() ? tiers_[tier]->arena.get() : nullptr;
  if (arena == nullptr || !arena->shared() || segment >= arena->segment_count()) {
    return absl::InvalidArgumentError(absl::StrCat("no shared segment ", segment, " in tier ", tier));
  }
  if (arena->Generation(segment) != generation || arena->SegmentFd(segment) < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment ", segment, " of tier ", tier, " is no longer generation ", generation));
  }
  if (arena->Owner(segment) != ns) {
    return absl::PermissionDeniedError(
        absl::StrCat("segment ", segment, " of tier ", tier, " holds another namespace's blocks"));
  }
  // Reopening through /proc gives a descriptor of the same memory that can
  // only be mapped read-only.
  const std::string path = absl::StrCat("/proc/self/fd/", arena->SegmentFd(segment));
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot reopen ", path, ": ", std::strerror(errno)));
  }
  arena->MarkExported(segment);  // from now on, it changes owner through a new memfd
  return fd;
}

StoreStats BlockStore::Stats() {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  StoreStats s = counters_;
  for (const auto& t : tiers_) {
    s.tiers.push_back(t->counters);
    if (t->arena != nullptr) {
      s.metadata_bytes += t->arena->total_pages() * sizeof(uint32_t) + t->arena->SegmentsAheadBytes();
    }
  }
  s.metadata_bytes += leases_.size() * sizeof(Lease);
  for (const auto& [id, lease] : leases_) s.metadata_bytes += lease.entries.capacity() * sizeof(Entry*);
  s.active_leases = leases_.size();
  s.pending_blocks = pending_blocks_;
  return s;
}

// ---- PutSession ----

struct PutSession::Pending {
  std::vector<uint32_t> pages;
  std::vector<bool> layers;
  uint32_t layers_left = 0;
  // By first layer: the slices' layer counts and payload CRCs, from which
  // the record's CRC is put together without reading the pages back (a
  // GPU's would be copied out again).
  struct Slice {
    uint32_t layers = 0;
    uint32_t payload_crc = 0;
  };
  std::vector<Slice> slices;
};

PutSession::PutSession(BlockStore* store, std::string ns, kvblock::LatentLayout layout)
    : store_(store),
      ns_(std::move(ns)),
      layout_(std::move(layout)),
      layout_id_(kvblock::LayoutId(layout_)),
      record_bytes_(kvblock::HeaderFor(layout_, 0, layout_.num_layers).RecordBytes()) {}

PutSession::~PutSession() {
  for (auto& [hash, pending] : pending_) Abandon(*pending);
}

void PutSession::Abandon(Pending& p) {
  absl::MutexLock lock(&store_->mu_);
  store_->FreePagesLocked(0, p.pages, record_bytes_);
  --store_->pending_blocks_;
}

absl::Status PutSession::AddSlice(const kvblock::BlockHash& hash, std::string_view record) {
  absl::StatusOr<kvblock::BlockView> slice = kvblock::ParseBlock(record, &layout_);
  if (!slice.ok()) {
    if (slice.status().code() == absl::StatusCode::kDataLoss) {
      absl::MutexLock lock(&store_->mu_);
      ++store_->counters_.checksum_failures;
    }
    return absl::Status(slice.status().code(), absl::StrCat("slice of block ",
                                                             kvblock::HashToHex(hash), ": ",
                                                             slice.status().message()));
  }
  const std::string key(kvblock::HashAsBytes(hash));
  auto it = pending_.find(key);
  if (it == pending_.end()) {
    absl::MutexLock lock(&store_->mu_);
    if (store_->index_.count(BlockStore::Key(ns_, hash)) > 0) {
      // Already stored: this slice and the block's others cost nothing.
      if (deduplicated_.insert(key).second) {
        ++summary_.blocks_deduplicated;
        ++store_->counters_.blocks_deduplicated;
      }
      return absl::OkStatus();
    }
    absl::StatusOr<std::vector<uint32_t>> pages = store_->AllocatePendingLocked(record_bytes_, ns_);
    if (!pages.ok()) return pages.status();
    auto pending = std::make_unique<Pending>();
    pending->pages = std::move(*pages);
    pending->layers.assign(layout_.num_layers, false);
    pending->layers_left = layout_.num_layers;
    pending->slices.resize(layout_.num_layers);
    it = pending_.emplace(key, std::move(pending)).first;
  }
  Pending& p = *it->second;
  const kvblock::BlockHeader& h = slice->header;
  for (uint32_t l = h.layer_begin; l < h.layer_begin + h.layer_count; ++l) {
    if (p.layers[l]) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " of block ",
                                                     kvblock::HashToHex(hash), " sent twice"));
    }
  }
  PageArena& arena = *store_->tiers_[0]->arena;
  KVTIER_RETURN_IF_ERROR(arena.Write(
      p.pages, kvblock::kBlockHeaderBytes + size_t{h.layer_begin} * h.layer_payload_bytes, slice->payloads));
  for (uint32_t l = h.layer_begin; l < h.layer_begin + h.layer_count; ++l) p.layers[l] = true;
  p.layers_left -= h.layer_count;
  // ParseBlock verified crc(header || payloads), the slice's last 4 bytes;
  // the payloads' own CRC follows from it and the header's.
  uint32_t slice_crc;
  std::memcpy(&slice_crc, record.data() + record.size() - sizeof slice_crc, sizeof slice_crc);
  const uint32_t header_crc = kvblock::Crc32c(record.data(), kvblock::kBlockHeaderBytes);
  p.slices[h.layer_begin] = {h.layer_count, kvblock::Crc32cCombine(header_crc, slice_crc, slice->payloads.size())};
  {
    absl::MutexLock lock(&store_->mu_);
    store_->counters_.bytes_in += record.size();
  }
  if (p.layers_left > 0) return absl::OkStatus();

  // Complete: header and checksum, then visible all at once.
  const auto header = kvblock::EncodeBlockHeader(kvblock::HeaderFor(layout_, 0, layout_.num_layers));
  KVTIER_RETURN_IF_ERROR(arena.Write(p.pages, 0, std::string_view(header.data(), header.size())));
  uint32_t crc = kvblock::Crc32c(header.data(), header.size());
  for (uint32_t l = 0; l < layout_.num_layers; l += p.slices[l].layers) {
    crc = kvblock::Crc32cCombine(crc, p.slices[l].payload_crc, size_t{p.slices[l].layers} * h.layer_payload_bytes);
  }
  KVTIER_RETURN_IF_ERROR(arena.Write(p.pages, record_bytes_ - kvblock::kBlockTrailerBytes,
                                     std::string_view(reinterpret_cast<const char*>(&crc), sizeof crc)));

  std::unique_ptr<Pending> done = std::move(it->second);
  pending_.erase(it);
  absl::MutexLock lock(&store_->mu_);
  --store_->pending_blocks_;
  BlockStore::Key index_key(ns_, hash);
  if (store_->index_.count(index_key) > 0) {  // another stream finished it first
    store_->FreePagesLocked(0, done->pages, record_bytes_);
    ++summary_.blocks_deduplicated;
    ++store_->counters_.blocks_deduplicated;
    return absl::OkStatus();
  }
  auto entry = std::make_unique<Entry>();
  entry->ns = ns_;
  entry->hash = hash;
  entry->layout_id = layout_id_;
  entry->size = record_bytes_;
  entry->tier = 0;
  entry->pages = std::move(done->pages);
  BlockStore::Tier& first = *store_->tiers_[0];
  first.lru.push_front(entry.get());
  entry->lru = first.lru.begin();
  ++first.counters.blocks;
  ++store_->counters_.blocks_stored;
  store_->counters_.metadata_bytes += EntryMetadataBytes(*entry);
  store_->index_.emplace(std::move(index_key), std::move(entry));
  ++summary_.blocks_stored;
  return absl::OkStatus();
}

PutSummary PutSession::Finish() {
  for (auto& [key, pending] : pending_) {
    Abandon(*pending);
    kvblock::BlockHash hash;
    std::memcpy(hash.data(), key.data(), hash.size());
    summary_.incomplete.push_back(hash);
  }
  pending_.clear();
  deduplicated_.clear();
  return summary_;
}

}  // namespace kvtier::cache
