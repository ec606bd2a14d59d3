// The store's policy over its tiers: Match and Read, leases, pins, and
// recovery. Making room (what owners are charged, the eviction order,
// demotion and eviction) is in room.cc, tier moves in tier_moves.cc, Put
// (PutSession, which assembles blocks, and the store's side of it) in
// put_session.cc; all share block_store_internal.h.
#include "services/cache/store/block_store.h"

#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/cache/store/block_store_internal.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/crc32c.h"

namespace kvtier::cache {

namespace {

// A lease id no other caller can guess (it releases the lease): from
// OpenSSL's CSPRNG, never 0, never with the fast path's bit.
uint64_t RandomLeaseId() {
  uint64_t id = 0;
  while (id == 0) {
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof id) != 1) {
      Log(LogLevel::kError, "store", "OpenSSL's random generator failed");
      std::abort();
    }
    id &= ~(uint64_t{1} << 63);
  }
  return id;
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

// A slab's own CRC of a record (a GPU's) that the landed copy's check
// overruled: every such record is then checked twice.
void WarnSlabCrcDisagreed(const kvblock::BlockHash& hash) {
  static RateLimitedLog log(LogLevel::kWarning, "store");
  log(absl::StrCat("the device tier's CRC of block ", kvblock::HashToHex(hash),
                   " disagreed with the check of its copy, which passed; such blocks are checked on the host"));
}

}  // namespace

// The copy's own check decides where the slab's CRC disagrees.
bool Intact(const std::vector<std::span<const uint8_t>>& landed, size_t size, std::optional<uint32_t> slab_crc,
            const kvblock::BlockHash& hash) {
  const uint32_t stored = kvblock::TrailerCrc(landed, size);
  if (slab_crc.has_value() && *slab_crc == stored) return true;
  const bool intact = ComputedCrc(landed, size) == stored;
  if (intact && slab_crc.has_value()) WarnSlabCrcDisagreed(hash);
  return intact;
}

RecordRoom RoomOf(const Entry& e) { return {e.ns, e.hash, e.pages, e.size, e.owner}; }

absl::Status ChecksumFailed(const kvblock::BlockHash& hash) {
  return absl::DataLossError(absl::StrCat("block ", kvblock::HashToHex(hash), " failed its checksum"));
}

size_t BlockStore::KeyHash::operator()(const Key& k) const {
  uint64_t h;
  std::memcpy(&h, k.second.data(), sizeof h);  // already uniformly distributed
  return h ^ std::hash<std::string>()(k.first);
}

// ---- PinnedBlock ----

PinnedBlock::PinnedBlock(BlockStore* store, Entry* entry, TierKind tier, std::vector<std::span<const uint8_t>> pieces,
                         std::shared_ptr<const uint8_t> owned, size_t size)
    : store_(store), entry_(entry), tier_(tier), owned_(std::move(owned)), pieces_(std::move(pieces)), size_(size) {}

PinnedBlock::~PinnedBlock() { store_->Unpin(entry_); }

// A pinned entry's tier and room change only under a move, which a reader's
// pin keeps off it; they were set before the pin was taken under the lock.
size_t PinnedBlock::tier_index() const { return entry_->tier; }
RecordRoom PinnedBlock::room() const { return RoomOf(*entry_); }

std::string PinnedBlock::CopyToString() const {
  std::string out;
  out.reserve(size_);
  for (const auto& piece : pieces_) out.append(reinterpret_cast<const char*>(piece.data()), piece.size());
  return out;
}

// ---- BlockStore ----

uint64_t StoreOptions::SegmentBytes(uint64_t capacity) const {
  constexpr uint64_t kSegmentsPerTier = 256, kSmallestSegment = 1 << 20;
  return std::min(segment_bytes, std::max(kSmallestSegment, capacity / kSegmentsPerTier));
}

uint64_t StoreOptions::RoomAhead(uint64_t capacity, uint64_t capacity_below) {
  return std::min(capacity / 64, capacity_below / 4);
}

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Create(const StoreOptions& options, Clock* clock) {
  if (options.page_size < 4096) {
    return absl::InvalidArgumentError("page size must be at least 4096 bytes");
  }
  std::vector<std::unique_ptr<Tier>> tiers;
  const std::pair<TierKind, uint64_t> configured[] = {{TierKind::kDevice, options.device_capacity},
                                                      {TierKind::kHost, options.host_capacity}};
  for (auto [kind, capacity] : configured) {
    if (capacity < options.page_size) {
      return absl::InvalidArgumentError(absl::StrCat(kind == TierKind::kDevice ? "TIER_DEVICE" : "TIER_HOST",
                                                     " capacity ", capacity, " bytes is below one page (",
                                                     options.page_size, " bytes)"));
    }
    ArenaOptions arena_options;
    arena_options.capacity = capacity;
    arena_options.page_size = options.page_size;
    arena_options.segment_pages =
        static_cast<uint32_t>(std::max<uint64_t>(1, options.SegmentBytes(capacity) / options.page_size));
    arena_options.shared = options.shared_memory;
    arena_options.make_segments_ahead = options.make_segments_ahead;
    if (kind == TierKind::kDevice) arena_options.slab = options.device_slab;
    if (kind == TierKind::kHost) arena_options.pin_for = options.device_slab;  // tier moves copy between them
    auto arena = PageArena::Create(arena_options);
    if (!arena.ok()) return arena.status();
    auto tier = std::make_unique<Tier>();
    tier->storage = PagesStorage(*std::move(arena));
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
    tier->storage = DiskStorage(*std::move(disk), options.disk_capacity);
    tier->counters.tier = TierKind::kDisk;
    tier->counters.capacity_bytes = options.disk_capacity;
    tiers.push_back(std::move(tier));
  }
  std::unique_ptr<BlockStore> store(new BlockStore(options, clock, std::move(tiers)));
  {
    absl::MutexLock lock(&store->mu_);
    store->RecoverLocked();
  }
  const auto& ahead = store->room_ahead_;
  if (std::any_of(ahead.begin(), ahead.end(), [](uint64_t room) { return room > 0; })) {
    store->demoter_thread_ = std::thread([s = store.get()] { s->DemoteAhead(); });
  }
  return store;
}

void BlockStore::RecoverLocked() {
  Tier& t = *tiers_.back();
  std::vector<DiskRecord> records = t.storage->Recover(counters_.checksum_failures);
  // Newest first, so the LRU list's back is the oldest file.
  std::sort(records.begin(), records.end(),
            [](const DiskRecord& a, const DiskRecord& b) { return a.mtime_ns > b.mtime_ns; });
  for (DiskRecord& r : records) {
    if (t.counters.used_bytes + t.storage->BytesTaken(r.size) > t.counters.capacity_bytes) {  // capacity shrank
      t.storage->Give({r.ns, r.hash, {}, r.size, r.owner}, /*written=*/true);
      ++t.counters.evictions;
      continue;
    }
    auto entry = std::make_unique<Entry>();
    entry->ns = std::move(r.ns);
    entry->owner = std::move(r.owner);
    entry->hash = r.hash;
    entry->layout_id = r.layout_id;
    entry->size = r.size;
    entry->v4_block = r.v4_block;
    entry->tier = tiers_.size() - 1;
    t.lru.push_back(entry.get());
    entry->lru = std::prev(t.lru.end());
    if (options_.eviction == Eviction::kAdaptive) {  // as if stored now, newest first: the oldest goes first
      entry->use = recency_or_frequency_.Stored(KeyHash()(Key(entry->ns, entry->hash)), recency_or_frequency_.Now(),
                                                index_.size());
      t.by_use.Place(entry.get());
    }
    ChargeLocked(tiers_.size() - 1, entry->owner, t.storage->BytesTaken(r.size), +1);
    ++t.counters.blocks;
    counters_.metadata_bytes += EntryMetadataBytes(*entry);
    Key key(entry->ns, entry->hash);
    index_.emplace(std::move(key), std::move(entry));
  }
}

BlockStore::BlockStore(const StoreOptions& options, Clock* clock, std::vector<std::unique_ptr<Tier>> tiers)
    : options_(options),
      clock_(clock),
      tiers_(std::move(tiers)),
      // A use's weight halves over eight fills of the whole store: a block's
      // uses over what the store can hold count, not its last alone.
      recency_or_frequency_(8 * std::accumulate(tiers_.begin(), tiers_.end(), uint64_t{0},
                                                [](uint64_t sum, const std::unique_ptr<Tier>& t) {
                                                  return sum + t->counters.capacity_bytes;
                                                })) {
  for (size_t t = 0; t < tiers_.size(); ++t) {
    const bool ahead = options_.demote_ahead && t + 1 < tiers_.size();
    const uint64_t room =
        ahead ? StoreOptions::RoomAhead(tiers_[t]->counters.capacity_bytes, tiers_[t + 1]->counters.capacity_bytes) : 0;
    room_ahead_.push_back(room - room % options_.page_size);  // under a page: none
  }
}

BlockStore::~BlockStore() { StopDemoter(); }

MatchResult BlockStore::Match(const std::string& ns, uint64_t layout_id, std::span<const kvblock::BlockHash> hashes,
                              std::optional<absl::Duration> lease_ttl, const std::string& owner, uint32_t max_leases,
                              bool to_restore_point) {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  MatchResult result;
  std::vector<Entry*> matched;
  for (const kvblock::BlockHash& hash : hashes) {
    auto it = index_.find(Key(ns, hash));
    if (it == index_.end() || it->second->layout_id != layout_id) break;
    Entry* e = it->second.get();
    matched.push_back(e);
    result.tiers.push_back(tiers_[e->tier]->counters.tier);
  }
  Entry* point = nullptr;  // the restore point the prefix is cut back to
  if (to_restore_point) {
    result.stored_blocks = static_cast<uint32_t>(matched.size());
    for (uint32_t i = 0; i < matched.size(); ++i) {
      auto it = index_.find(Key(ns, kvblock::RestorePointKey(hashes[i])));
      if (it != index_.end() && it->second->layout_id == layout_id) {
        result.restore_points.push_back(i);
        point = it->second.get();
      }
    }
    const size_t restorable = result.restore_points.empty() ? 0 : result.restore_points.back() + 1;
    matched.resize(restorable);
    result.tiers.resize(restorable);
  }
  if (options_.eviction != Eviction::kLru) {  // leaf-first
    for (auto e = matched.rbegin(); e != matched.rend(); ++e) TouchLocked(*e);
  } else {
    for (Entry* e : matched) TouchLocked(e);
  }
  result.matched_blocks = static_cast<uint32_t>(matched.size());
  // The point last: its block's eviction takes it, nothing else first.
  if (point != nullptr) {
    TouchLocked(point);
    matched.push_back(point);
  }
  if (!lease_ttl.has_value() || matched.empty()) return result;
  uint32_t& held = leases_by_owner_[owner];
  if (held >= (max_leases > 0 ? max_leases : options_.max_leases_per_owner)) {
    result.lease_status = absl::ResourceExhaustedError(
        absl::StrCat(held, " leases held, the most one tenant may hold; release some or let them expire"));
    return result;
  }
  ++held;
  absl::Duration ttl = *lease_ttl <= absl::ZeroDuration() ? options_.default_lease_ttl : *lease_ttl;
  ttl = std::min(ttl, options_.max_lease_ttl);
  for (Entry* e : matched) PinLocked(e);
  do {
    result.lease_id = RandomLeaseId();
  } while (leases_.contains(result.lease_id));
  result.lease_deadline = clock_->Now() + ttl;
  leases_[result.lease_id] =
      Lease{lease_deadlines_.emplace(result.lease_deadline, result.lease_id), std::move(matched), owner};
  return result;
}

absl::Status BlockStore::ReleaseLease(uint64_t lease_id, const std::string& owner) {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  auto it = leases_.find(lease_id);
  // Another owner's lease is as unknown as one that never was.
  if (it == leases_.end() || it->second.owner != owner) {
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " is unknown or expired"));
  }
  EndLeaseLocked(it);
  return absl::OkStatus();
}

void BlockStore::EndLeaseLocked(absl::flat_hash_map<uint64_t, Lease>::iterator lease) {
  for (Entry* e : lease->second.entries) UnpinLocked(e);
  lease_deadlines_.erase(lease->second.deadline);
  auto held = leases_by_owner_.find(lease->second.owner);
  if (--held->second == 0) leases_by_owner_.erase(held);
  leases_.erase(lease);
}

void BlockStore::ExpireLeases() {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
}

void BlockStore::ExpireLeasesLocked() {
  const absl::Time now = clock_->Now();
  while (!lease_deadlines_.empty() && lease_deadlines_.begin()->first <= now) {
    EndLeaseLocked(leases_.find(lease_deadlines_.begin()->second));
  }
}

absl::StatusOr<std::shared_ptr<const PinnedBlock>> BlockStore::Read(const std::string& ns, uint64_t layout_id,
                                                                    const kvblock::BlockHash& hash,
                                                                    const ReadOptions& options) {
  Entry* e;
  size_t tier;
  std::vector<uint32_t> pages;
  TierKind served_from;
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
      return absl::FailedPreconditionError(absl::StrCat("block ", kvblock::HashToHex(hash), " was stored under layout ",
                                                        absl::Hex(e->layout_id), ", not ", absl::Hex(layout_id)));
    }
    Tier& from = *tiers_[e->tier];
    ++from.counters.hits;
    served_from = from.counters.tier;
    PinLocked(e);  // before the move: making room must not pick this block
    if (e->tier != 0 && options.promote && !MoveLocked(std::span(&e, 1), 0)[0] && e->zombie) {
      UnpinLocked(e);
      return absl::DataLossError(
          absl::StrCat("block ", kvblock::HashToHex(hash), " failed its checksum and was dropped"));
    }
    // Leaf-first: the Match before a Get set the prefix's order; reading
    // it block by block would set it back to the first-oldest order.
    if (options_.eviction == Eviction::kLru) TouchLocked(e);
    // Promotion can fail only when the device tier is all pinned; then the
    // block is served from where it is.
    tier = e->tier;
    pages = e->pages;
  }
  // Pinned, with a reader's pin no move commits: its storage stays as it
  // is, so it is read (a file, a copy out of a slab) and verified without
  // the lock.
  RecordBytes bytes;
  const TierStorage& storage = *tiers_[tier]->storage;
  const bool in_place = !options.copy_out && !storage.in_memory();
  if (!in_place) {
    absl::StatusOr<RecordBytes> read = storage.Read({ns, hash, pages, e->size, e->owner});
    if (read.ok()) bytes = *std::move(read);
  }
  if (!in_place &&
      (bytes.pieces.empty() || (options.verify_checksum && !Intact(bytes.pieces, e->size, bytes.crc, hash)))) {
    absl::MutexLock lock(&mu_);
    ++counters_.checksum_failures;
    if (!e->zombie) DropLocked(e);
    UnpinLocked(e);
    return absl::DataLossError(
        absl::StrCat("block ", kvblock::HashToHex(hash), " failed its checksum and was dropped"));
  }
  if (!in_place) {  // a block pinned unread is counted by whoever reads it
    absl::MutexLock lock(&mu_);
    counters_.bytes_out += e->size;
  }
  return std::shared_ptr<const PinnedBlock>(
      new PinnedBlock(this, e, served_from, std::move(bytes.pieces), std::move(bytes.owned), e->size));
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
  auto it =
      std::find_if(zombies_.begin(), zombies_.end(), [e](const std::unique_ptr<Entry>& z) { return z.get() == e; });
  zombies_.erase(it);
}

void BlockStore::Refresh(const std::string& ns, uint64_t layout_id, std::span<const kvblock::BlockHash> hashes) {
  if (options_.eviction == Eviction::kLru) return;
  absl::MutexLock lock(&mu_);
  for (auto h = hashes.rbegin(); h != hashes.rend(); ++h) {
    auto it = index_.find(Key(ns, *h));
    if (it != index_.end() && it->second->layout_id == layout_id) TouchLocked(it->second.get());
  }
}

void BlockStore::PinLocked(Entry* e) {
  if (e->pins++ == 0) ++counters_.pinned_blocks;
}

std::string BlockStore::SegmentGroup(const std::string& ns) const {
  return options_.segment_group ? options_.segment_group(ns) : ns;
}

std::string BlockStore::SegmentOwnerOf(const std::string& ns, const std::string& owner) const {
  return SegmentOwner(SegmentGroup(ns), owner);
}

TierStorage& BlockStore::storage(size_t tier) const { return *tiers_[tier]->storage; }

std::vector<SharedPiece> BlockStore::SharedPieces(const PinnedBlock& block) {
  absl::MutexLock lock(&mu_);  // a segment's generation changes under it
  const Entry& e = *block.entry_;
  if (block.owned_ != nullptr) return {};  // a copy, not where it lies
  return tiers_[e.tier]->storage->SharedPieces(static_cast<uint32_t>(e.tier), RoomOf(e));
}

absl::StatusOr<int> BlockStore::OpenSegmentReadOnly(uint32_t tier, uint32_t segment, uint64_t generation,
                                                    const std::string& ns) {
  absl::MutexLock lock(&mu_);  // a segment's owner and generation change under it
  if (tier >= tiers_.size() || !tiers_[tier]->storage->shareable()) {
    return absl::InvalidArgumentError(absl::StrCat("no shared segment ", segment, " in tier ", tier));
  }
  return tiers_[tier]->storage->OpenShared(segment, generation, SegmentGroup(ns));
}

StoreStats BlockStore::Stats() {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  StoreStats s = counters_;
  for (const auto& t : tiers_) {
    s.tiers.push_back(t->counters);
    s.tiers.back().segment_slack_bytes = t->storage->SlackBytes();
    s.tiers.back().probation_bytes = t->probation_bytes;
    s.metadata_bytes += t->storage->MetadataBytes();
  }
  s.metadata_bytes += probation_share_.MemoryBytes() + recency_or_frequency_.MemoryBytes();
  s.probation_share = probation_share_.share();
  s.frequency_share = recency_or_frequency_.frequency_share();
  s.metadata_bytes += leases_.size() * sizeof(Lease);
  for (const auto& [id, lease] : leases_) s.metadata_bytes += lease.entries.capacity() * sizeof(Entry*);
  s.active_leases = leases_.size();
  s.pending_blocks = pending_blocks_;
  for (const auto& [owner, book] : owners_) {
    if (book.used == std::array<uint64_t, 3>{}) continue;
    std::array<uint64_t, 3>& charged = s.used_by_owner[owner];
    for (size_t tier = 0; tier < tiers_.size(); ++tier) charged[tier] = ChargedLocked(book, tier);
    if (book.quota.tier_bytes != std::array<uint64_t, 3>{}) s.quota_by_owner[owner] = book.quota.tier_bytes;
  }
  s.evictions_by_owner.insert(evictions_by_owner_.begin(), evictions_by_owner_.end());
  return s;
}

}  // namespace kvtier::cache
