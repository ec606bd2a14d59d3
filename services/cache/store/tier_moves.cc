// The store's tier moves: blocks copied to another tier without the lock
// (demotion as room is made, or ahead of it on a thread of its own;
// promotion on a read; the memory tiers to disk before a stop), each
// copy's CRC checked where it lands before the index points at it.
#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/base/log.h"
#include "services/cache/store/block_store.h"
#include "services/cache/store/block_store_internal.h"
#include "services/kvblock/block_format.h"

namespace kvtier::cache {
namespace {

// A tier move whose copy failed (not a checksum: the copying itself, a
// GPU's error say): the block stays where it was, or is dropped when its
// room is needed.
void WarnMoveFailed(const absl::Status& copied) {
  static RateLimitedLog log(LogLevel::kWarning, "store");
  log(absl::StrCat("a tier move failed (", copied.ToString(),
                   "); such blocks stay in their tier, or are evicted when their room is needed"));
}

// Runs fn(0), ..., fn(n - 1) on up to `threads` threads, this one among
// them.
void OnThreads(size_t n, size_t threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < std::min(n, threads); ++t) helpers.emplace_back(work);
  work();
  for (std::thread& helper : helpers) helper.join();
}

// Blocks a save moves at a time, and the threads that write a batch's
// files at once.
constexpr size_t kSaveBatchBlocks = 16;
constexpr size_t kDiskWriteThreads = 4;

}  // namespace

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
      const std::string segment_owner = SegmentOwnerOf(e->ns, e->owner);
      if (!dst.storage->Fits(e->size) || !MakeRoomLocked(to, e->size, segment_owner, e->owner).ok()) continue;
      std::vector<uint32_t> pages;  // the room, reserved
      if (!TakeRoomLocked(to, e->size, segment_owner, e->owner, pages)) continue;
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
          EvictForFullStorageLocked(to, moves[k].entry->size)) {
        wanted.push_back(moves[k].index);
      }
    }
  }
  return moved;
}

void BlockStore::DemoteAhead() {
  // Pinned blocks, or a tier below that cannot take more, may leave nothing
  // to move: then it looks again after this long, whatever room is taken
  // meanwhile (Puts signal only an idle demoter), instead of scanning the
  // tier at every Put.
  constexpr absl::Duration kStuckRetry = absl::Milliseconds(100);
  absl::MutexLock lock(&mu_);
  while (true) {
    // A condition variable, not mu_.Await: a condition on the store's lock
    // would be evaluated at every release of it.
    demoter_ = Demoter::kIdle;
    while (!stopping_ && !DemotionDueLocked()) demotion_due_.Wait(&mu_);
    if (stopping_) return;
    demoter_ = Demoter::kMoving;
    bool moved = false;
    for (size_t tier = 0; tier + 1 < tiers_.size(); ++tier) moved = DemoteAheadLocked(tier) || moved;
    if (!moved) {
      demoter_ = Demoter::kStuck;
      const absl::Time retry = absl::Now() + kStuckRetry;
      while (!stopping_ && absl::Now() < retry) demotion_due_.WaitWithDeadline(&mu_, retry);
    }
  }
}

void BlockStore::StopDemoter() {
  if (!demoter_thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    demotion_due_.Signal();
  }
  demoter_thread_.join();
}

BlockStore::Saved BlockStore::SaveForRestart(absl::Time deadline) {
  StopDemoter();
  absl::MutexLock lock(&mu_);
  Saved saved;
  const size_t disk = tiers_.size() - 1;
  if (tiers_[disk]->counters.tier != TierKind::kDisk) return saved;
  while (!leases_.empty()) EndLeaseLocked(leases_.begin());
  std::vector<Entry*> hottest_first;
  for (size_t tier = 0; tier < disk; ++tier) {
    for (Entry* e : tiers_[tier]->lru) hottest_first.push_back(e);
  }
  // All pinned: a block moved down is no victim when room is made on disk
  // for the next (the disk's own blocks go first, then none), and none of
  // them is evicted with another (a V4 block's restore point) meanwhile.
  for (Entry* e : hottest_first) PinLocked(e);
  Tier& to = *tiers_[disk];
  std::vector<Entry*> moved;  // hottest first
  uint64_t moved_bytes = 0;   // of the disk's room, what they take (or will, once their batch has gone)
  // In batches, whose files are written at once (CopyRecords). One another
  // reader holds, one the disk cannot take beside those moved (nor its
  // owner's quota there, nor a failing disk) stays; the next may go.
  std::vector<Entry*> batch;
  const auto move_batch = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::vector<bool> went = MoveLocked(batch, disk);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (went[i]) {
        moved.push_back(batch[i]);
      } else {
        moved_bytes -= to.storage->BytesTaken(batch[i]->size);
      }
      (went[i] ? saved.blocks : saved.left_blocks) += 1;
      (went[i] ? saved.bytes : saved.left_bytes) += batch[i]->size;
    }
    batch.clear();
  };
  for (Entry* e : hottest_first) {
    if (!batch.empty() && batch.back()->tier != e->tier) move_batch();  // a move reads one tier
    const uint64_t taken = to.storage->BytesTaken(e->size);
    if (clock_->Now() < deadline && e->pins == 1 && moved_bytes + taken <= to.counters.capacity_bytes) {
      moved_bytes += taken;
      batch.push_back(e);
      if (batch.size() == kSaveBatchBlocks) move_batch();
    } else {
      saved.left_blocks += 1;
      saved.left_bytes += e->size;
    }
  }
  if (!batch.empty()) move_batch();
  std::vector<RecordRoom> oldest_first;
  for (auto e = moved.rbegin(); e != moved.rend(); ++e) oldest_first.push_back(RoomOf(**e));
  to.storage->OrderForRestart(oldest_first);
  for (Entry* e : hottest_first) UnpinLocked(e);
  return saved;
}

bool BlockStore::ShortOfRoomAheadLocked(size_t tier) const {
  const TierCounters& c = tiers_[tier]->counters;
  return c.capacity_bytes - c.used_bytes < room_ahead_[tier];
}

bool BlockStore::DemotionDueLocked() const {
  for (size_t tier = 0; tier + 1 < tiers_.size(); ++tier) {
    if (ShortOfRoomAheadLocked(tier)) return true;
  }
  return false;
}

bool BlockStore::DemoterRestingLocked() const {
  return demoter_ == Demoter::kStuck || (demoter_ == Demoter::kIdle && !DemotionDueLocked());
}

void BlockStore::WaitForRoomAhead() {
  if (!demoter_thread_.joinable()) return;
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &BlockStore::DemoterRestingLocked));
}

bool BlockStore::DemoteAheadLocked(size_t tier) {
  Tier& t = *tiers_[tier];
  // One block at a time (a slab's batch): its room is free as soon as it
  // is down, for the Put that waits for it.
  const uint64_t batch = std::max<uint64_t>(1, t.storage->MoveBatchBytes(t.counters.capacity_bytes));
  bool moved_any = false;
  while (!stopping_ && ShortOfRoomAheadLocked(tier)) {
    // As MakeRoomLocked chooses: owners over their quota or without one
    // first.
    std::vector<Entry*> victims = VictimsLocked(tier, batch, [&](const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !WithinQuotaLocked(e.owner, tier);
    });
    if (victims.empty()) victims = VictimsLocked(tier, batch, [](const Entry&) { return true; });
    if (victims.empty()) break;
    for (Entry* v : victims) PinLocked(v);  // as FreeWhileLocked: out of the next tier's own eviction
    const std::vector<bool> moved = MoveLocked(victims, tier + 1);
    for (Entry* v : victims) UnpinLocked(v);
    const auto went = static_cast<uint64_t>(std::count(moved.begin(), moved.end(), true));
    if (went == 0) break;
    t.counters.demotions_ahead += went;
    moved_any = true;
  }
  return moved_any;
}

bool BlockStore::EvictForFullStorageLocked(size_t tier, size_t bytes) {
  static RateLimitedLog log(LogLevel::kWarning, "store");
  Tier& t = *tiers_[tier];
  const std::vector<Entry*> victims = VictimsLocked(tier, bytes, [](const Entry& e) { return !e.moving; });
  for (Entry* victim : victims) EvictLocked(victim);
  log(absl::StrCat("the storage under a tier is full before its capacity (", t.counters.used_bytes, " of ",
                   t.counters.capacity_bytes, " bytes in use); evicted ", victims.size(), " blocks to make room"));
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
    // What was written is ours to remove, unless a newer block of that key
    // took its place (a file under its name).
    const bool ours = copied.ok() && !(e->zombie && index_.count(Key(e->ns, e->hash)) > 0);
    GiveRoomLocked(to, {e->ns, e->hash, pages, e->size, e->owner}, ours);
    if (copied.code() == absl::StatusCode::kDataLoss) {  // a corrupt record never reaches another tier
      ++counters_.checksum_failures;
      if (!e->zombie) DropLocked(e);
    } else if (!copied.ok()) {
      ++dst.counters.write_errors;
      WarnMoveFailed(copied);
    }
    return false;
  }
  Tier& src = *tiers_[from];
  UnlinkLocked(e);
  --src.counters.blocks;
  ReleaseStorageLocked(*e);
  // The page list's size differs between tiers (none on disk): the
  // bookkeeping counted for the entry follows it.
  counters_.metadata_bytes -= EntryMetadataBytes(*e);
  e->pages = std::move(pages);
  counters_.metadata_bytes += EntryMetadataBytes(*e);
  e->tier = to;
  LinkLocked(e);
  ++dst.counters.blocks;
  if (to < from) {
    ++dst.counters.promotions;
  } else {
    ++src.counters.demotions;
  }
  return true;
}

std::vector<absl::Status> BlockStore::CopyRecords(std::span<const Move> moves, size_t to) const {
  const TierStorage& src = *tiers_[moves[0].from]->storage;  // the same for all
  const TierStorage& dst = *tiers_[to]->storage;
  std::vector<RecordRoom> sources, rooms;
  std::vector<std::vector<std::span<uint8_t>>> outs;
  for (const Move& m : moves) {
    dst.Prepare(m.pages);
    const Entry& e = *m.entry;
    sources.push_back({e.ns, e.hash, m.source, e.size, e.owner});
    rooms.push_back({e.ns, e.hash, m.pages, e.size, e.owner});
    outs.push_back(dst.Memory(rooms.back()));
  }
  // A source's read failing for its own bytes (a file gone or altered)
  // loses the block; any other leaves it where it was.
  const auto read_failed = [](const absl::Status& s, const kvblock::BlockHash& hash) {
    const bool lost = s.code() == absl::StatusCode::kDataLoss || s.code() == absl::StatusCode::kNotFound;
    return lost ? ChecksumFailed(hash) : s;
  };
  std::vector<absl::Status> copied;
  if (!outs[0].empty()) {
    // Into memory: out of the source all at once (one wait for a GPU),
    // each checked where it landed (or by the CRC a GPU computed where it
    // lay, when that agrees).
    std::vector<std::optional<uint32_t>> crcs(moves.size());
    const std::vector<absl::Status> read = src.ReadInto(sources, outs, crcs);
    for (size_t k = 0; k < moves.size(); ++k) {
      const kvblock::BlockHash& hash = moves[k].entry->hash;
      const std::vector<std::span<const uint8_t>> landed(outs[k].begin(), outs[k].end());
      if (!read[k].ok()) {
        copied.push_back(read_failed(read[k], hash));
      } else {
        copied.push_back(Intact(landed, moves[k].entry->size, crcs[k], hash) ? absl::OkStatus() : ChecksumFailed(hash));
      }
    }
    return copied;
  }
  // Into files: each record read and checked here, then the files written
  // on several threads at once (each write is the kernel's copy into the
  // page cache, a core's work). A full or failing disk: the block stays.
  copied.resize(moves.size());
  std::vector<RecordBytes> records(moves.size());
  std::vector<size_t> writes;
  for (size_t k = 0; k < moves.size(); ++k) {
    const kvblock::BlockHash& hash = moves[k].entry->hash;
    absl::StatusOr<RecordBytes> bytes = src.Read(sources[k]);
    if (!bytes.ok()) {
      copied[k] = read_failed(bytes.status(), hash);
    } else if (!Intact(bytes->pieces, moves[k].entry->size, bytes->crc, hash)) {
      copied[k] = ChecksumFailed(hash);
    } else {
      records[k] = *std::move(bytes);
      writes.push_back(k);
    }
  }
  OnThreads(writes.size(), kDiskWriteThreads,
            [&](size_t i) { copied[writes[i]] = dst.Write(rooms[writes[i]], records[writes[i]].pieces); });
  return copied;
}

}  // namespace kvtier::cache
