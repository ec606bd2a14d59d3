// The cache's store of latent block records, in tiers.
//
// Tiers, fastest first: device (a GPU's memory in a slab reached by copies,
// or host memory standing in for it), host, and optionally disk (files).
// Each keeps its records in a TierStorage (tier_storage.h: private pages,
// memfd segments that same-host readers map, a GPU slab, or files); this
// class is the policy over them and never asks which kind a tier is. A
// tier that is full demotes its least-recently-used unpinned blocks to the
// next tier; the last tier drops them. Reading a block promotes it to the
// first tier. Every tier move and every read verifies the record's CRC32C
// (unless the reader says it will); a block that fails is dropped and
// counted, never served. Reads and tier moves copy and check records
// without the store's lock.
//
// Blocks are keyed by (namespace, chain hash). A Put assembles a block from
// layer slices in pages of the first tier that only its session can see; the
// block becomes visible to Match and Read all at once, when its last layer
// has arrived. Pinned blocks (by a lease or by a reader) are never moved or
// dropped.
//
// Thread-safe. One mutex guards the index, tiers and leases; page contents
// are read without it while pinned, and written without it only while owned
// by a PutSession.
#ifndef KVTIER_SERVICES_CACHE_STORE_BLOCK_STORE_H_
#define KVTIER_SERVICES_CACHE_STORE_BLOCK_STORE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/base/clock.h"
#include "services/cache/store/arc_target.h"
#include "services/cache/store/recency_or_frequency.h"
#include "services/cache/store/tier_storage.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/block_key.h"
#include "services/kvblock/layout.h"

namespace kvtier::cache {

// Which blocks a full tier gives up first.
enum class Eviction {
  // The least recently used, each block on its own. A Match refreshes a
  // prefix from its first block on, so the first is the oldest and goes
  // first, taking every block after it out of reach.
  kLru,
  // The least recently used, but a Match refreshes a prefix from its last
  // block back to its first: within a prefix the last blocks go first, and
  // what stays is still a prefix someone can match. A Read does not
  // refresh (in chain order it would undo that); a Get refreshes its
  // blocks as a Match does once it has read them all (Refresh). A Put
  // stream's new blocks are ordered so too: each behind the one the stream
  // stored before it.
  kLeafFirst,
  // kLeafFirst's order, but blocks stored and not used since are on
  // probation: while they take more than a share of a tier they go first,
  // oldest first, so that prompts seen once do not push out what is used
  // again; of them, blocks a cold start stored (a Put whose client found
  // little of the sequence cached: PutHeader.cold_start) go before those
  // that continue a cached prefix. The share adapts to what comes back
  // after eviction (ArcTarget): where the room holds what is reused it
  // stays at the whole tier, which is kLeafFirst. Else the victim is
  // recency's or, in a share of the cases where they differ that also
  // adapts, frequency's: the block used least, recent uses weighing most
  // (RecencyOrFrequency). The default: load/README.md's eviction tables.
  kAdaptive,
};

struct StoreOptions {
  uint64_t device_capacity = 0;  // bytes; both must be positive
  uint64_t host_capacity = 0;
  std::string disk_dir;        // empty: no disk tier
  uint64_t disk_capacity = 0;  // bytes of records under disk_dir
  uint32_t page_size = 16 * 1024;
  // Page tiers in memfd segments, so same-host readers can map them (the
  // fast path). A segment holds the blocks of one group of namespaces:
  // those segment_group gives one key (the cache: those the same tenants
  // may read, TenantRegistry::ReaderClass), so that a reader allowed one
  // of them may map them all; unset, each namespace is its own group.
  // Called under the store's lock. A segment also holds one tenant's
  // blocks alone (SegmentOwner), so the room a part empty one keeps from
  // others is charged to that tenant (beyond one segment a group, which
  // SegmentBytes keeps small).
  bool shared_memory = false;
  uint64_t segment_bytes = 4 << 20;  // the most a segment takes
  // The segments of a tier of `capacity`: a 256th of it, at least 1 MiB
  // (about a block of a large model) and at most segment_bytes, in whole
  // pages; so a group reserves at most a 256th of a small tier. Not
  // smaller: a fast path reader maps more segments, and more records
  // span two (1 MiB segments in a 1 GiB tier read about 30% slower on
  // first mapping).
  uint64_t SegmentBytes(uint64_t capacity) const;
  std::function<std::string(const std::string& ns)> segment_group;
  // New memfds for segments readers had, made ahead (ArenaOptions).
  bool make_segments_ahead = true;
  // The device tier in this slab (a GPU's memory) instead of host memory.
  std::shared_ptr<SlabMemory> device_slab;
  absl::Duration default_lease_ttl = absl::Seconds(30);
  absl::Duration max_lease_ttl = absl::Minutes(1);
  // Leases one owner (a tenant) may hold at once.
  uint32_t max_leases_per_owner = 1024;
  // Blocks being assembled at once, across all Put streams; in one stream;
  // for one owner (a tenant), so that no stream or tenant holds all of it.
  uint32_t max_pending_blocks = 1024;
  uint32_t max_pending_per_stream = 256;
  uint32_t max_pending_per_owner = 512;
  // Memory the incomplete blocks of one owner (a tenant: not the one trust
  // domain's "") without a pending_bytes quota may take at once; 0: half
  // the device tier.
  uint64_t max_pending_bytes_per_owner = 0;
  Eviction eviction = Eviction::kAdaptive;
  // Each tier with one below keeps room free ahead (RoomAhead) by demoting
  // its coldest blocks on a thread of its own, so that a Put finds its room
  // without waiting for a demotion's copy and check. The tiers then hold
  // that much less; off, a tier demotes only when room is asked of it.
  bool demote_ahead = false;
  // The room kept free ahead in a tier of `capacity` above one of
  // `capacity_below`: a 64th of it, at most a quarter of the tier below
  // (the store keeps it in whole pages: none under one).
  static uint64_t RoomAhead(uint64_t capacity, uint64_t capacity_below);
};

// What an owner (a tenant) is charged for each block's bookkeeping (its
// index entry, in host memory, outside every tier's capacity) beside the
// pages or slot its record takes in a tier: its used bytes and its quota
// count both, so many tiny blocks cannot hold more than the quota says.
inline constexpr uint64_t kBookkeepingBytesPerBlock = 256;

// What one owner (a tenant) may hold: bytes per tier, fastest first (as
// the memory its blocks take: whole pages), 0 for no limit.
struct OwnerQuota {
  std::array<uint64_t, 3> tier_bytes{};
  // Memory its incomplete blocks (Put streams still assembling them) may
  // take at once; 0 for no limit.
  uint64_t pending_bytes = 0;
};

struct TierCounters {
  TierKind tier = TierKind::kDevice;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;  // taken by visible and pending blocks: whole pages in a page tier
  uint64_t blocks = 0;      // visible blocks
  uint64_t hits = 0;
  uint64_t promotions = 0;
  uint64_t demotions = 0;
  uint64_t demotions_ahead = 0;  // of them, made to keep room free ahead (StoreOptions::demote_ahead)
  uint64_t evictions = 0;
  uint64_t write_errors = 0;  // records it could not store (a full or failing disk)
  // Free pages in segments a segment owner holds (the fast path's shared
  // tiers): only that owner's blocks can use them.
  uint64_t segment_slack_bytes = 0;
  // Eviction::kAdaptive: memory its blocks stored and not used since take.
  uint64_t probation_bytes = 0;
};

struct StoreStats {
  std::vector<TierCounters> tiers;
  uint64_t metadata_bytes = 0;  // and memfds made ahead (see cache.proto)
  // Eviction::kAdaptive: of each tier, what blocks on probation may take
  // before they go first (1: plain leaf-first); and of the victims where
  // recency's and frequency's differ, what share frequency chooses (0:
  // plain leaf-first).
  double probation_share = 1.0;
  double frequency_share = 0.0;
  uint64_t misses = 0;
  uint64_t blocks_stored = 0;
  uint64_t blocks_stored_cold_start = 0;  // of them, by Puts marked cold_start
  uint64_t blocks_deduplicated = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t checksum_failures = 0;          // of stored records: on a read, a tier move or recovery
  uint64_t arrival_checksum_failures = 0;  // of slices as Put received them: the sender's fault
  uint64_t active_leases = 0;
  uint64_t pending_blocks = 0;
  uint64_t pinned_blocks = 0;  // by leases and readers
  // Bytes each owner is charged, per tier (owners that hold some): its
  // blocks' pages or slots, kBookkeepingBytesPerBlock a block, and the free
  // room of its segments beyond one segment each (BlockStore::ChargedLocked).
  std::map<std::string, std::array<uint64_t, 3>> used_by_owner;
  // The quota each owner that holds blocks is held to, per tier (0: none
  // there), as its last Put or SetQuotas gave it; owners without one left out.
  std::map<std::string, std::array<uint64_t, 3>> quota_by_owner;
  // Blocks of each owner's evicted, ever (owners that lost some).
  std::map<std::string, uint64_t> evictions_by_owner;
};

struct MatchResult {
  uint32_t matched_blocks = 0;
  // With to_restore_point: the stored prefix before it was cut back, and
  // the positions in it whose restore point is stored (ascending).
  uint32_t stored_blocks = 0;
  std::vector<uint32_t> restore_points;
  std::vector<TierKind> tiers;
  uint64_t lease_id = 0;  // 0 = none taken
  absl::Time lease_deadline;
  // Not OK when a lease was asked for and refused (RESOURCE_EXHAUSTED: its
  // owner holds as many as it may).
  absl::Status lease_status;
};

class BlockStore;
struct Entry;

// A block pinned for reading: its record bytes stay in place, unchanged,
// until this object is destroyed. Thread-safe to read from.
class PinnedBlock {
 public:
  ~PinnedBlock();
  PinnedBlock(const PinnedBlock&) = delete;
  PinnedBlock& operator=(const PinnedBlock&) = delete;

  size_t size() const { return size_; }
  // The tier it was read from (before any promotion).
  TierKind tier() const { return tier_; }
  // Where it lies now: its tier's index (fastest first) and its room there,
  // which stay as they are while this pin lasts.
  size_t tier_index() const;
  RecordRoom room() const;
  // The record in pieces (runs of adjacent pages, or one copy), in order.
  const std::vector<std::span<const uint8_t>>& pieces() const { return pieces_; }
  std::string CopyToString() const;

 private:
  friend class BlockStore;
  // `pieces` point into the store's pages, or into `owned`: a copy read from
  // disk or out of a slab (null otherwise).
  PinnedBlock(BlockStore* store, Entry* entry, TierKind tier, std::vector<std::span<const uint8_t>> pieces,
              std::shared_ptr<const uint8_t> owned, size_t size);

  BlockStore* store_;
  Entry* entry_;
  TierKind tier_;
  std::shared_ptr<const uint8_t> owned_;
  std::vector<std::span<const uint8_t>> pieces_;
  size_t size_;
};

struct PutSummary {
  uint32_t blocks_stored = 0;
  uint32_t blocks_deduplicated = 0;
  std::vector<kvblock::BlockHash> incomplete;
};

// Assembles the blocks of one Put stream. Not thread-safe (one stream, one
// caller at a time). Destroying it without Finish frees every block it had
// not completed, as when the stream is cancelled.
class PutSession {
 public:
  ~PutSession();
  PutSession(const PutSession&) = delete;
  PutSession& operator=(const PutSession&) = delete;

  // Parses and verifies one slice record (block_format.md) and stages its
  // layers; the block is committed when its last layer arrives. Errors:
  // INVALID_ARGUMENT / FAILED_PRECONDITION / DATA_LOSS from the parser,
  // INVALID_ARGUMENT for a layer sent twice, RESOURCE_EXHAUSTED when no room
  // can be made. A failed slice leaves the session usable.
  absl::Status AddSlice(const kvblock::BlockHash& hash, std::string_view record);
  // The same for a record that lies in pieces (gRPC's receive buffers),
  // written to the block's room without being gathered first.
  absl::Status AddSlice(const kvblock::BlockHash& hash, std::span<const std::span<const uint8_t>> record);
  // Frees the blocks still incomplete and reports what this session did.
  PutSummary Finish();

 private:
  friend class BlockStore;
  struct Pending;
  PutSession(BlockStore* store, std::string ns, kvblock::LatentLayout layout, std::string owner, bool cold_start,
             double use_stamp);
  void Abandon(Pending& pending);
  // A DeepSeek-V4 record (format 3), parsed as `header`: it arrives whole,
  // takes room of its own size and is stored as it came.
  absl::Status AddWholeRecord(const kvblock::BlockHash& hash, std::span<const std::span<const uint8_t>> record,
                              const kvblock::BlockHeader& header);
  // A block found stored already (`key`: its hash's bytes), counted once.
  void NoteDeduplicated(const std::string& key);
  // Makes a block written whole into `pages` visible (PublishPending).
  void Publish(const kvblock::BlockHash& hash, size_t bytes, std::vector<uint32_t> pages, bool v4_block);

  BlockStore* store_;
  std::string ns_;
  std::string segment_owner_;  // of its blocks, asked once
  std::string owner_;
  kvblock::LatentLayout layout_;
  uint64_t layout_id_;
  size_t record_bytes_;
  std::unordered_map<std::string, std::unique_ptr<Pending>> pending_;  // by hash bytes
  std::unordered_set<std::string> deduplicated_;                       // blocks found already stored
  std::optional<kvblock::BlockHash> last_stored_;                      // the latest block it made visible
  const bool cold_start_;                                              // BeginPut's
  const double use_stamp_;  // of its blocks' store: the clock as it began (RecencyOrFrequency::Now)
  PutSummary summary_;
};

class BlockStore {
 public:
  static absl::StatusOr<std::unique_ptr<BlockStore>> Create(const StoreOptions& options, Clock* clock);
  ~BlockStore();

  // Longest prefix of `hashes` stored in `ns` under `layout_id`. With a
  // lease_ttl the matched blocks are pinned until ReleaseLease or the
  // deadline (ttl 0 = the default; capped at max_lease_ttl), by a lease of
  // `owner`'s, under an id no one can guess; the owner holds at most
  // `max_leases` at once (0: max_leases_per_owner). With
  // `to_restore_point` (DeepSeek-V4) the prefix is cut back to its last
  // block whose restore point (kvblock::RestorePointKey) is stored, and
  // that point is refreshed and leased with it; the result also says where
  // in the whole stored prefix points are (a client with several shards
  // finds the longest restorable prefix over all of them).
  MatchResult Match(const std::string& ns, uint64_t layout_id, std::span<const kvblock::BlockHash> hashes,
                    std::optional<absl::Duration> lease_ttl = std::nullopt, const std::string& owner = "",
                    uint32_t max_leases = 0, bool to_restore_point = false);
  // NOT_FOUND for an unknown or expired lease, or one of another owner's.
  absl::Status ReleaseLease(uint64_t lease_id, const std::string& owner = "");

  // Pins one block for reading: promotes it to the first tier if it can,
  // verifies its checksum. NOT_FOUND if absent; DATA_LOSS if its checksum
  // failed (the block is dropped); FAILED_PRECONDITION if it was stored
  // under another layout.
  struct ReadOptions {
    // False leaves the check to a reader that checks the bytes as it copies
    // them (the fast path); a tier move still verifies.
    bool verify_checksum = true;
    // False serves the block from the tier it is in.
    bool promote = true;
    // False pins a block that is not in memory (on disk, in a slab)
    // without reading it: its pieces are then empty (a slab's block can be
    // copied device to device by its storage).
    bool copy_out = true;
  };
  absl::StatusOr<std::shared_ptr<const PinnedBlock>> Read(const std::string& ns, uint64_t layout_id,
                                                          const kvblock::BlockHash& hash, const ReadOptions& options);
  absl::StatusOr<std::shared_ptr<const PinnedBlock>> Read(const std::string& ns, uint64_t layout_id,
                                                          const kvblock::BlockHash& hash) {
    return Read(ns, layout_id, hash, ReadOptions());
  }
  // A reader has used these blocks of a prefix (`hashes` in chain order;
  // absent ones skipped), as a Get that read them one by one: under
  // leaf-first they are refreshed last to first, as a Match refreshes a
  // prefix, so a client that reads without Match keeps its prefix too;
  // under LRU each Read already refreshed its block.
  void Refresh(const std::string& ns, uint64_t layout_id, std::span<const kvblock::BlockHash> hashes);

  // Tier `tier`'s storage (fastest first): its properties, and what only
  // its kind can do with a pinned block (TierStorage::CopyToExported).
  TierStorage& storage(size_t tier) const;

  // A Put stream into `ns` for `owner`, whose blocks (those it stores, and
  // its incomplete ones) are bounded together, and by `quota` (which
  // replaces what the owner's last stream said). An owner over its quota in
  // a tier demotes or drops its own least recently used blocks; room made
  // for anyone is taken from owners over their quotas or without one
  // first, never from one within its quota while there is another choice.
  // `cold_start`: the client found little of the sequence cached
  // (kAdaptive lets such blocks go first while they are on probation).
  std::unique_ptr<PutSession> BeginPut(std::string ns, kvblock::LatentLayout layout, std::string owner = "",
                                       OwnerQuota quota = {}, bool cold_start = false);

  // Gives the owners that hold blocks these quotas, and those it does not
  // name none, before their next Put brings theirs: a start's blocks found
  // on disk are held to their tenants' quotas at once, and a quota changed
  // (or a tenant gone) in a tenants file read again holds from then on. An
  // owner that holds nothing gets its quota with its next Put.
  void SetQuotas(std::span<const std::pair<std::string, OwnerQuota>> quotas) ABSL_LOCKS_EXCLUDED(mu_);

  // Where a pinned block's record lies in shared segments
  // (TierStorage::SharedPieces); empty when some of it is not in one (a
  // copy read from disk, a tier that is not shared).
  std::vector<SharedPiece> SharedPieces(const PinnedBlock& block);
  // A new read-only descriptor of a shared segment, for a reader of `ns`
  // (the caller closes it). INVALID_ARGUMENT for no such segment;
  // FAILED_PRECONDITION when it is no longer at `generation` or has no
  // memfd; PERMISSION_DENIED when it does not hold `ns`'s blocks.
  absl::StatusOr<int> OpenSegmentReadOnly(uint32_t tier, uint32_t segment, uint64_t generation, const std::string& ns);

  // Ends leases whose deadline has passed (also done by every call above).
  void ExpireLeases();
  StoreStats Stats();
  // Waits until every tier has its room ahead free, or no more blocks can
  // go down for now; at once without demote_ahead (for tests and
  // benchmarks).
  void WaitForRoomAhead();

  // What SaveForRestart moved to the disk tier, and what it left where it was.
  struct Saved {
    uint64_t blocks = 0, bytes = 0;
    uint64_t left_blocks = 0, left_bytes = 0;
  };
  // For a store about to stop whose next start opens the same disk tier:
  // moves the memory tiers' blocks into it until `deadline`, the most
  // recently used first (the first tier's, then the next's), the disk's
  // own blocks giving way, never those moved before; and orders its files
  // so that the next start finds those moved the newest, in the order they
  // had. Every lease ends first (no caller is left to read), and the
  // demoting thread stops. Nothing without a disk tier.
  Saved SaveForRestart(absl::Time deadline);

 private:
  friend class PinnedBlock;
  friend class PutSession;
  struct Tier;
  struct Lease;
  struct KeyHash {
    size_t operator()(const std::pair<std::string, kvblock::BlockHash>& k) const;
  };
  using Key = std::pair<std::string, kvblock::BlockHash>;

  BlockStore(const StoreOptions& options, Clock* clock, std::vector<std::unique_ptr<Tier>> tiers);

  void ExpireLeasesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLeaseLocked(absl::flat_hash_map<uint64_t, Lease>::iterator lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PinLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unpin(Entry* entry);
  void UnpinLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts an entry (its tier set) in its tier's lists: as the newest, or
  // just behind `after` (a block of the same tier that should outlive it).
  void LinkLocked(Entry* entry, Entry* after = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes it out of them.
  void UnlinkLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes an entry on probation out of its tier's probation list.
  void OffProbationListLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unpinned blocks of `tier` that `eligible` allows, about `bytes` of them
  // (at least one if any), in the order the eviction policy gives them up.
  std::vector<Entry*> VictimsLocked(size_t tier, uint64_t bytes, const std::function<bool(const Entry&)>& eligible)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes room in `tier` for a record of `bytes` of `owner`'s, demoting or
  // dropping LRU unpinned blocks: first the owner's own while it would be
  // over its quota, then as BeginPut says; RESOURCE_EXHAUSTED, naming the
  // quota or the tier, when pinned blocks leave too little room.
  // `segment_owner` is the record's (SegmentOwnerOf): in a shared arena only
  // its segments, or empty ones, can take it.
  absl::Status MakeRoomLocked(size_t tier, size_t bytes, const std::string& segment_owner, const std::string& owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The segment group of `ns`'s blocks (StoreOptions::segment_group).
  std::string SegmentGroup(const std::string& ns) const;
  // The segment owner of `owner`'s blocks of `ns` (SegmentOwner).
  std::string SegmentOwnerOf(const std::string& ns, const std::string& owner) const;
  // Demotes or drops LRU unpinned blocks of `tier` that `eligible` allows
  // while `short_of_room` holds; false when none is left to go.
  bool FreeWhileLocked(size_t tier, size_t bytes, const std::function<bool()>& short_of_room,
                       const std::function<bool(const Entry&)>& eligible) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `owner` has a quota in `tier` and is within it.
  bool WithinQuotaLocked(const std::string& owner, size_t tier) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct OwnerBook;
  // What an owner is charged in `tier`: its blocks' room and bookkeeping,
  // and the free room its segments hold beyond one segment each (room
  // only it can use, kept by blocks its segments still hold); with `fill`
  // bytes of segment owner `filling` about to be taken out of that room.
  uint64_t ChargedLocked(const OwnerBook& book, size_t tier, const std::string& filling = {}, uint64_t fill = 0) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds (or with a negative sign takes away) room an owner's record took.
  void ChargeLocked(size_t tier, const std::string& owner, uint64_t bytes, int sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes room in `tier` for a record of `bytes` of `owner`'s, in
  // `segment_owner`'s segments, and charges it; false (nothing taken) when
  // there is none.
  bool TakeRoomLocked(size_t tier, size_t bytes, const std::string& segment_owner, const std::string& owner,
                      std::vector<uint32_t>& pages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops an owner's book once it holds nothing (its quota comes again
  // with its next Put).
  void ForgetIfEmptyLocked(const std::string& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasRoomLocked(size_t tier, size_t bytes, const std::string& segment_owner) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The storage under `tier` filled before its capacity (a file system
  // under a disk tier): evicts its LRU unpinned blocks until `bytes` of
  // them are gone; false when none could go.
  bool EvictForFullStorageLocked(size_t tier, size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Move;
  // Moves pinned blocks of one tier to `to` with verified copies, made
  // without the lock (it is released and taken again inside); moved[i] says
  // whether entries[i] went. One stays in place when the destination has no
  // room, or it is moving or read by another; on a checksum failure it is
  // dropped.
  std::vector<bool> MoveLocked(std::span<Entry* const> entries, size_t to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The demoting thread (StoreOptions::demote_ahead).
  void DemoteAhead();
  // Stops it and waits for it (if there is one).
  void StopDemoter();
  // Demotes `tier`'s blocks in the policy's order while it has less than its
  // room ahead free; false when none could go.
  bool DemoteAheadLocked(size_t tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ShortOfRoomAheadLocked(size_t tier) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A tier has less than its room ahead free.
  bool DemotionDueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // It waits with nothing it can do (WaitForRoomAhead).
  bool DemoterRestingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits a move whose copy is done, or undoes it; true when it went.
  bool FinishMoveLocked(Move& move, size_t to, const absl::Status& copied) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies and checks each move's record into its room in tier `to`,
  // without the lock: into memory, out of the source in one batch (one wait
  // for a GPU) and checked where it landed; into files, each read and
  // checked, then the batch's files written on several threads at once.
  // DATA_LOSS when a check fails; other errors leave the block where it was.
  std::vector<absl::Status> CopyRecords(std::span<const Move> moves, size_t to) const;
  void DropLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a block to make room, counted as an eviction of its tier and owner.
  void EvictLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back the room holding a block's record.
  void ReleaseStorageLocked(const Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back room of tier `tier` taken for a record (charged to its owner).
  void GiveRoomLocked(size_t tier, const RecordRoom& room, bool written) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restores the blocks the last tier still holds from before (a disk's).
  void RecoverLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes room in the first tier for a block of segment owner
  // `segment_owner` being assembled by a Put stream of `owner` that holds
  // `stream_pending` incomplete blocks (RESOURCE_EXHAUSTED past the bounds
  // on incomplete blocks); EndPendingLocked when it is stored or dropped.
  absl::StatusOr<std::vector<uint32_t>> AllocatePendingLocked(size_t bytes, const std::string& segment_owner,
                                                              const std::string& owner, size_t stream_pending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndPendingLocked(const std::string& owner, size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // What a PutSession asks of the store; it touches nothing else of it.
  // The room for block `hash` of `ns`, of segment owner `segment_owner`
  // (AllocatePendingLocked), or nullopt when the block is stored already.
  absl::StatusOr<std::optional<std::vector<uint32_t>>> BeginPending(const std::string& ns,
                                                                    const std::string& segment_owner,
                                                                    const kvblock::BlockHash& hash,
                                                                    const std::string& owner, size_t stream_pending,
                                                                    size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives back the room of a block its owner's stream did not complete.
  void AbandonPending(const RecordRoom& room) ABSL_LOCKS_EXCLUDED(mu_);
  // Counts a slice that arrived: its bytes, or a failed checksum; a block
  // found stored already.
  void CountArrival(size_t bytes, bool checksum_failed) ABSL_LOCKS_EXCLUDED(mu_);
  void CountDeduplicated() ABSL_LOCKS_EXCLUDED(mu_);
  // Where blocks are assembled; its room taken by BeginPending is the
  // session's alone until published or abandoned.
  TierStorage& FirstTier() const;
  // Makes a block that `owner`'s Put has written whole into first-tier
  // `pages` visible, all at once; false (its room given back, counted as
  // deduplicated) when another stream stored the same block first. It is
  // ordered behind block `after` of `ns` (the stream's previous one, if
  // still in the first tier) for eviction.
  // A DeepSeek-V4 block (`v4_block`) takes its restore point with it when
  // it is evicted; `cold_start` is BeginPut's, `use_stamp` the session's.
  bool PublishPending(const std::string& ns, const kvblock::BlockHash& hash, uint64_t layout_id,
                      const std::string& owner, size_t bytes, std::vector<uint32_t> pages,
                      const std::optional<kvblock::BlockHash>& after, bool v4_block, bool cold_start, double use_stamp)
      ABSL_LOCKS_EXCLUDED(mu_);

  const StoreOptions options_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  // Fixed at construction; each Tier's lists and counters are guarded by mu_.
  const std::vector<std::unique_ptr<Tier>> tiers_;
  std::unordered_map<Key, std::unique_ptr<Entry>, KeyHash> index_ ABSL_GUARDED_BY(mu_);
  // Dropped while pinned: freed when the last pin goes.
  std::vector<std::unique_ptr<Entry>> zombies_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  // The leases by deadline, soonest first: expiry looks only at those due.
  std::multimap<absl::Time, uint64_t> lease_deadlines_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> leases_by_owner_ ABSL_GUARDED_BY(mu_);
  uint32_t pending_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  // What each owner holds and may hold (kept while it has blocks, pending
  // ones or a quota).
  struct OwnerBook {
    OwnerQuota quota;
    std::array<uint64_t, 3> used{};
    uint32_t pending_blocks = 0;
    uint64_t pending_bytes = 0;            // taken by them in the first tier
    std::set<std::string> segment_owners;  // its blocks' (SegmentOwnerOf), since it last held none
  };
  absl::flat_hash_map<std::string, OwnerBook> owners_ ABSL_GUARDED_BY(mu_);
  // Kept when an owner's book goes: a counter never falls.
  absl::flat_hash_map<std::string, uint64_t> evictions_by_owner_ ABSL_GUARDED_BY(mu_);
  StoreStats counters_ ABSL_GUARDED_BY(mu_);  // the non-tier counters
  // kAdaptive's: what blocks on probation may take of a tier (a block
  // evicted on probation coming back raises it), and the choice between
  // recency and frequency.
  ArcTarget probation_share_ ABSL_GUARDED_BY(mu_){/*start=*/1.0, /*floor=*/0.1};
  RecencyOrFrequency recency_or_frequency_ ABSL_GUARDED_BY(mu_);
  // By tier (0 for the last, and without demote_ahead); fixed at
  // construction.
  std::vector<uint64_t> room_ahead_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The demoting thread: waiting for room to be taken, moving blocks, or
  // waiting after a pass that moved none.
  enum class Demoter { kIdle, kMoving, kStuck };
  Demoter demoter_ ABSL_GUARDED_BY(mu_) = Demoter::kMoving;
  absl::CondVar demotion_due_;  // room taken below a tier's room ahead while idle, or stopping
  std::thread demoter_thread_;  // last: started once the rest is built (when a tier keeps room ahead)
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_BLOCK_STORE_H_
