// What BlockStore and PutSession share and nobody else sees: an index
// entry, a tier, a lease. Guarded by BlockStore::mu_ unless said.
#ifndef KVTIER_SERVICES_CACHE_STORE_BLOCK_STORE_INTERNAL_H_
#define KVTIER_SERVICES_CACHE_STORE_BLOCK_STORE_INTERNAL_H_

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "services/cache/store/block_store.h"
#include "services/cache/store/use_order.h"

namespace kvtier::cache {

struct Entry {
  std::string ns;
  // The tenant whose Put stored it (quotas); empty: nobody's (no tenants
  // file, or a version 2 disk file).
  std::string owner;
  kvblock::BlockHash hash;
  uint64_t layout_id = 0;
  size_t size = 0;  // record bytes
  size_t tier = 0;
  std::vector<uint32_t> pages;
  uint32_t pins = 0;
  bool zombie = false;  // dropped while pinned; pages freed at the last unpin
  bool moving = false;  // being copied to another tier (without the lock)
  // kAdaptive: stored and not used since, in its tier's probation list too;
  // and stored by a cold start, in its tier's cold list as well.
  bool on_probation = false;
  bool cold_start = false;
  // A DeepSeek-V4 block: its restore point (kvblock::RestorePointKey) is
  // evicted with it, since a prefix can only be restored where one is.
  bool v4_block = false;
  std::list<Entry*>::iterator lru;
  std::list<Entry*>::iterator probation;  // while on_probation
  std::list<Entry*>::iterator cold;       // while on_probation and cold_start
  // kAdaptive: its use score (RecencyOrFrequency) and a tie-break, and its
  // place in its tier's UseOrder; which choice last pushed it out of a
  // tier, if recency's and frequency's victims differed.
  UseKey use{0, 0};
  std::map<UseKey, Entry*>::iterator by_use;
  RecencyOrFrequency::Choice chosen_by = RecencyOrFrequency::Choice::kAgreed;
};

struct BlockStore::Tier {
  std::unique_ptr<TierStorage> storage;  // fixed after Create
  std::list<Entry*> lru;                 // every block, most recently used first
  std::list<Entry*> probation;           // kAdaptive: blocks on probation, newest first
  std::list<Entry*> cold;                // those of them a cold start stored, newest first
  UseOrder<Entry> by_use;                // kAdaptive: every block, the least used first
  uint64_t probation_bytes = 0;          // the room they take
  TierCounters counters;
};

struct BlockStore::Lease {
  std::multimap<absl::Time, uint64_t>::iterator deadline;  // in lease_deadlines_
  std::vector<Entry*> entries;
  std::string owner;
};

// Bookkeeping bytes an index entry costs beyond its payload: the entry, its
// page list, its namespace copy and the hash-map node.
inline size_t EntryMetadataBytes(const Entry& e) {
  constexpr size_t kMapNode = 64;
  return sizeof(Entry) + kMapNode + e.pages.capacity() * sizeof(uint32_t) + e.ns.capacity();
}

// Whether a record copied out of its tier is intact (block_store.cc): by
// its slab's CRC (a GPU's) when that agrees with the landed trailer, else
// by checking the copy.
bool Intact(const std::vector<std::span<const uint8_t>>& landed, size_t size, std::optional<uint32_t> slab_crc,
            const kvblock::BlockHash& hash);
// DATA_LOSS naming the block.
absl::Status ChecksumFailed(const kvblock::BlockHash& hash);
// Where an entry's record lies.
RecordRoom RoomOf(const Entry& e);

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_BLOCK_STORE_INTERNAL_H_
