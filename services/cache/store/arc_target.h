// A share that moves as ARC's target does (Megiddo and Modha), from what
// comes back after eviction: the store remembers blocks evicted for
// either of two reasons, and one stored again says its reason was wrong.
// A block evicted as one that `raises` the share on its return moves it
// up, any other down, each step the other kind's remembered count over
// this kind's, in blocks of the store; between `floor` and 1.
//
// Eviction::kAdaptive keeps two: the share of a tier that blocks on
// probation (stored and not used since) may take before they go first
// (starts at 1, the whole tier: plain recency; a block evicted on
// probation raises it, one evicted after use lowers it); and the share of
// victims frequency chooses rather than recency (RecencyOrFrequency).
// Not thread-safe: the store calls it under its lock.
#ifndef KVTIER_SERVICES_CACHE_STORE_ARC_TARGET_H_
#define KVTIER_SERVICES_CACHE_STORE_ARC_TARGET_H_

#include <cstddef>
#include <cstdint>

#include "services/cache/store/ghosts.h"

namespace kvtier::cache {

class ArcTarget {
 public:
  ArcTarget(double start, double floor) : floor_(floor), share_(start) {}

  double share() const { return share_; }
  // A block (its key's fingerprint) is stored while the store holds
  // `held_blocks`: true when it was evicted and is remembered (the share
  // moved).
  bool Returning(uint64_t fingerprint, size_t held_blocks);
  // A block was evicted; as many of each kind as the store holds blocks
  // are remembered.
  void Evicted(uint64_t fingerprint, bool raises, size_t held_blocks);
  // Host memory the remembered blocks take (the store's bookkeeping).
  size_t MemoryBytes() const;

 private:
  const double floor_;
  double share_;
  Ghosts raising_;
  Ghosts lowering_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_ARC_TARGET_H_
