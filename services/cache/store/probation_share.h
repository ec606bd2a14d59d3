// What Eviction::kAdaptive learns from the blocks it evicts. Blocks stored
// and not used since are on probation: while they take more than a share
// of a tier they go first (oldest first), else the least recently used of
// all does. The share starts at the whole tier (plain recency: LRU) and
// moves as ARC's target does (Megiddo and Modha): a block stored again
// after it was evicted on probation says probation was too short (the
// share grows), one stored again after recency evicted it (it had been
// used again) says the room for used blocks was (the share shrinks), each
// step the other kind's remembered count over this kind's, in blocks of
// the store. Down to `floor`, so a prompt's new blocks always have room.
// Not thread-safe: the store calls it under its lock.
#ifndef KVTIER_SERVICES_CACHE_STORE_PROBATION_SHARE_H_
#define KVTIER_SERVICES_CACHE_STORE_PROBATION_SHARE_H_

#include <cstddef>
#include <cstdint>
#include <list>

#include "absl/container/flat_hash_map.h"

namespace kvtier::cache {

class ProbationShare {
 public:
  explicit ProbationShare(double floor = 0.1) : floor_(floor) {}

  // Of each tier's capacity, what blocks on probation may take before they
  // go first.
  double share() const { return share_; }
  // A block (its key's fingerprint) is stored while the store holds
  // `held_blocks`: true when it was evicted and is remembered, so it goes
  // straight to the used blocks; false when it goes on probation.
  bool Returning(uint64_t fingerprint, size_t held_blocks);
  // A block was evicted; as many of each kind as the store holds blocks
  // are remembered.
  void Evicted(uint64_t fingerprint, bool on_probation, size_t held_blocks);
  // Host memory the remembered blocks take (the store's bookkeeping).
  size_t MemoryBytes() const;

 private:
  // Fingerprints, oldest first, bounded.
  class Ghosts {
   public:
    size_t size() const { return order_.size(); }
    void Add(uint64_t fingerprint, size_t bound);
    bool Contains(uint64_t fingerprint) const;
    bool Take(uint64_t fingerprint);  // true if it was there
    size_t MemoryBytes() const;

   private:
    std::list<uint64_t> order_;
    absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> where_;
  };

  const double floor_;
  double share_ = 1.0;
  Ghosts evicted_on_probation_;
  Ghosts evicted_used_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_PROBATION_SHARE_H_
