// What Eviction::kAdaptive gives up once probation is within its share:
// recency's victim (the least recently used, leaf-first) or frequency's
// (the lowest use score), where the two differ. Recency alone loses a set
// of blocks used again and again that is larger than the room (shared
// system prompts) to blocks used twice and then never; frequency alone
// keeps what was popular long after, and where the room holds what is
// reused, recency is right. So frequency may choose only where room is
// scarce and the difference is large (Choose), each choice is remembered
// when its victim is evicted, and one stored again moves the share of
// victims frequency chooses (an ArcTarget starting at none, leaf-first)
// away from the choice that let it go.
//
// A block's use score counts each store and each hit, halved for every
// `half_life_bytes` stored since: kept as log2 of the sum of 2^stamp over
// its uses, the stamp being the bytes stored so far over the half-life,
// so that it never overflows and comparing two needs no decay. Scores of
// evicted blocks are remembered too, so a popular block stored again is
// not new. Not thread-safe: the store calls it under its lock.
#ifndef KVTIER_SERVICES_CACHE_STORE_RECENCY_OR_FREQUENCY_H_
#define KVTIER_SERVICES_CACHE_STORE_RECENCY_OR_FREQUENCY_H_

#include <cstddef>
#include <cstdint>

#include "services/cache/store/arc_target.h"
#include "services/cache/store/ghosts.h"
#include "services/cache/store/use_order.h"

namespace kvtier::cache {

class RecencyOrFrequency {
 public:
  // Which choice pushed a block out of a tier, when the two differed.
  enum class Choice : uint8_t { kAgreed, kRecency, kFrequency };

  explicit RecencyOrFrequency(uint64_t half_life_bytes);

  // The stamp of a use now.
  double Now() const;
  // `bytes` more stored: the clock the stamps read.
  void Advance(uint64_t bytes) { clock_bytes_ += bytes; }
  // A score with one more use stamped `stamp`.
  static double AddUse(double score, double stamp);
  // The key of a block stored with `stamp` while the store holds
  // `held_blocks`: its score is that use plus its remembered uses if it was
  // evicted (its return moves the share of frequency's choices). Of blocks
  // with the same score the one stored later goes first: a stream stores a
  // prompt first block first, and its blocks are stamped alike.
  UseKey Stored(uint64_t fingerprint, double stamp, size_t held_blocks);
  // The key of a block with `before` used again now. Of blocks with the
  // same score the one used first goes first: a Match uses a prefix last
  // block first.
  UseKey Used(const UseKey& before);
  // Of recency's victim and frequency's, a different block, which goes:
  // recency's, learning nothing (kAgreed), unless room is scarce (the
  // share of a tier on probation at most a half: used blocks were lost to
  // recency) and recency's was used at least twice as much; then
  // frequency's in its share of such choices (kFrequency), else kRecency.
  Choice Choose(double recency_victim_score, double frequency_victim_score, double probation_share);
  // A block with `score` was evicted, pushed out of its last tier by
  // `chosen_by`. Scores of four times the blocks the store holds are
  // remembered, choices of as many as it holds.
  void Evicted(uint64_t fingerprint, double score, Choice chosen_by, size_t held_blocks);
  // Of the victims where the two differ, what share frequency chooses.
  double frequency_share() const { return frequency_share_.share(); }
  // Host memory what it remembers takes (the store's bookkeeping).
  size_t MemoryBytes() const;

 private:
  const double half_life_bytes_;
  uint64_t clock_bytes_ = 0;
  ArcTarget frequency_share_{/*start=*/0.0, /*floor=*/0.0};
  double frequency_due_ = 0;  // its share of the choices made, less those it made
  Ghosts scores_;             // of evicted blocks
  int64_t ties_ = 0;          // tie-breaks handed out
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_RECENCY_OR_FREQUENCY_H_
