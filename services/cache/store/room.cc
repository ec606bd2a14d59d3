// The room a tier has: what each owner is charged for the pages or slots
// its blocks take, and making room when a tier is short of it: the
// eviction order (recency, and adaptive's probation and cold-start
// lists), the victims it gives, demoted to the tier below or evicted.
#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "services/cache/store/block_store.h"
#include "services/cache/store/block_store_internal.h"
#include "services/kvblock/block_format.h"

namespace kvtier::cache {

void BlockStore::GiveRoomLocked(size_t tier, const RecordRoom& room, bool written) {
  Tier& t = *tiers_[tier];
  t.storage->Give(room, written);
  ChargeLocked(tier, room.owner, t.storage->BytesTaken(room.size), -1);
}

void BlockStore::ChargeLocked(size_t tier, const std::string& owner, uint64_t bytes, int sign) {
  OwnerBook& book = owners_[owner];
  if (sign > 0) {
    tiers_[tier]->counters.used_bytes += bytes;
    book.used[tier] += bytes + kBookkeepingBytesPerBlock;
    return;
  }
  tiers_[tier]->counters.used_bytes -= bytes;
  book.used[tier] -= bytes + kBookkeepingBytesPerBlock;
  ForgetIfEmptyLocked(owner);
}

bool BlockStore::TakeRoomLocked(size_t tier, size_t bytes, const std::string& segment_owner, const std::string& owner,
                                std::vector<uint32_t>& pages) {
  TierStorage& storage = *tiers_[tier]->storage;
  if (!storage.Take(bytes, segment_owner, pages)) return false;
  ChargeLocked(tier, owner, storage.BytesTaken(bytes), +1);
  owners_[owner].segment_owners.insert(segment_owner);
  // Only an idle demoter waits for this: a moving one looks again when its
  // pass ends, a stuck one when its retry is due.
  if (demoter_ == Demoter::kIdle && ShortOfRoomAheadLocked(tier)) demotion_due_.Signal();
  return true;
}

void BlockStore::ForgetIfEmptyLocked(const std::string& owner) {
  auto it = owners_.find(owner);
  if (it->second.pending_blocks == 0 && it->second.used == std::array<uint64_t, 3>{}) owners_.erase(it);
}

void BlockStore::SetQuotas(std::span<const std::pair<std::string, OwnerQuota>> quotas) {
  absl::flat_hash_map<std::string_view, const OwnerQuota*> given;
  for (const auto& [owner, quota] : quotas) given.emplace(owner, &quota);
  absl::MutexLock lock(&mu_);
  for (auto& [owner, book] : owners_) {
    auto it = given.find(owner);
    book.quota = it != given.end() ? *it->second : OwnerQuota{};
  }
}

bool BlockStore::WithinQuotaLocked(const std::string& owner, size_t tier) const {
  auto it = owners_.find(owner);
  if (it == owners_.end()) return true;  // holds nothing here
  const uint64_t limit = it->second.quota.tier_bytes[tier];
  return limit > 0 && ChargedLocked(it->second, tier) <= limit;
}

uint64_t BlockStore::ChargedLocked(const OwnerBook& book, size_t tier, const std::string& filling,
                                   uint64_t fill) const {
  const TierStorage& storage = *tiers_[tier]->storage;
  uint64_t slack = 0;
  for (const std::string& segment_owner : book.segment_owners) {
    uint64_t held = storage.SlackBytesOf(segment_owner);
    if (segment_owner == filling) held -= std::min(held, fill);
    slack += held - std::min(held, storage.SegmentBytes());  // a segment being filled is free
  }
  return book.used[tier] + slack;
}

void BlockStore::ReleaseStorageLocked(const Entry& e) { GiveRoomLocked(e.tier, RoomOf(e), /*written=*/true); }

bool BlockStore::HasRoomLocked(size_t tier, size_t bytes, const std::string& segment_owner) const {
  const Tier& t = *tiers_[tier];
  return t.storage->HasRoom(bytes, segment_owner, t.counters.capacity_bytes - t.counters.used_bytes);
}

void BlockStore::TouchLocked(Entry* e) {
  Tier& t = *tiers_[e->tier];
  if (e->on_probation) {  // used again: off probation
    OffProbationListLocked(e);
    e->on_probation = e->cold_start = false;
  }
  t.lru.splice(t.lru.begin(), t.lru, e->lru);
  if (options_.eviction != Eviction::kAdaptive) return;
  e->use = recency_or_frequency_.Used(e->use);  // UseOrder places it anew lazily
  e->chosen_by = RecencyOrFrequency::Choice::kAgreed;
}

void BlockStore::LinkLocked(Entry* e, Entry* after) {
  Tier& t = *tiers_[e->tier];
  e->lru = after != nullptr ? t.lru.insert(std::next(after->lru), e) : t.lru.insert(t.lru.begin(), e);
  if (options_.eviction == Eviction::kAdaptive) t.by_use.Place(e);
  if (!e->on_probation) return;
  e->probation = after != nullptr && after->on_probation ? t.probation.insert(std::next(after->probation), e)
                                                         : t.probation.insert(t.probation.begin(), e);
  t.probation_bytes += t.storage->BytesTaken(e->size);
  if (!e->cold_start) return;
  e->cold = after != nullptr && after->cold_start ? t.cold.insert(std::next(after->cold), e)
                                                  : t.cold.insert(t.cold.begin(), e);
}

void BlockStore::UnlinkLocked(Entry* e) {
  Tier& t = *tiers_[e->tier];
  t.lru.erase(e->lru);
  if (options_.eviction == Eviction::kAdaptive) t.by_use.Remove(e);
  if (e->on_probation) OffProbationListLocked(e);
}

void BlockStore::OffProbationListLocked(Entry* e) {
  Tier& t = *tiers_[e->tier];
  t.probation.erase(e->probation);
  t.probation_bytes -= t.storage->BytesTaken(e->size);
  if (e->cold_start) t.cold.erase(e->cold);
}

std::vector<Entry*> BlockStore::VictimsLocked(size_t tier, uint64_t bytes,
                                              const std::function<bool(const Entry&)>& eligible) {
  Tier& t = *tiers_[tier];
  const bool adaptive = options_.eviction == Eviction::kAdaptive;
  const double probation_room = probation_share_.share() * static_cast<double>(t.counters.capacity_bytes);
  uint64_t on_probation = t.probation_bytes;  // after the victims so far go
  std::vector<Entry*> victims;
  absl::flat_hash_set<const Entry*> chosen;  // a block is in two to four orders
  const auto usable = [&](const Entry* e) { return e->pins == 0 && !chosen.contains(e) && eligible(*e); };
  // The oldest usable block of a list (newest first) from `at` on, where
  // `at` is left; null when none is left.
  const auto oldest = [&](std::list<Entry*>& list, std::list<Entry*>::reverse_iterator& at) -> Entry* {
    while (at != list.rend() && !usable(*at)) ++at;
    return at == list.rend() ? nullptr : *at;
  };
  auto oldest_cold = t.cold.rbegin(), oldest_on_probation = t.probation.rbegin(), least_recent = t.lru.rbegin();
  UseOrder<Entry>::Search least_used(t.by_use);
  for (uint64_t taken = 0; taken < bytes;) {
    Entry* next = nullptr;
    if (adaptive && static_cast<double>(on_probation) > probation_room) {
      // A cold start's blocks first, then the rest on probation.
      next = oldest(t.cold, oldest_cold);
      if (next == nullptr) next = oldest(t.probation, oldest_on_probation);
    }
    if (next == nullptr) {
      next = oldest(t.lru, least_recent);
      if (next == nullptr) break;
      Entry* by_frequency = adaptive ? least_used.Least(usable) : next;  // next is in it too: one is found
      if (by_frequency != next) {
        const RecencyOrFrequency::Choice choice =
            recency_or_frequency_.Choose(next->use.first, by_frequency->use.first, probation_share_.share());
        if (choice == RecencyOrFrequency::Choice::kFrequency) next = by_frequency;
        if (choice != RecencyOrFrequency::Choice::kAgreed) next->chosen_by = choice;
      }
    }
    chosen.insert(next);
    victims.push_back(next);
    taken += next->size;
    if (next->on_probation) on_probation -= t.storage->BytesTaken(next->size);
  }
  return victims;
}

void BlockStore::EvictLocked(Entry* e) {
  if (options_.eviction == Eviction::kAdaptive) {
    const uint64_t fingerprint = KeyHash()(Key(e->ns, e->hash));
    probation_share_.Evicted(fingerprint, /*raises=*/e->on_probation, index_.size());
    recency_or_frequency_.Evicted(fingerprint, e->use.first, e->chosen_by, index_.size());
  }
  ++tiers_[e->tier]->counters.evictions;
  ++evictions_by_owner_[e->owner];
  std::optional<Key> point;
  if (e->v4_block) point.emplace(e->ns, kvblock::RestorePointKey(e->hash));
  DropLocked(e);  // e may be gone
  // A V4 block's restore point goes with it, unless it is being read or
  // moved (then it goes by the policy's own order: with its block gone no
  // Match can end at it).
  if (point.has_value()) {
    auto it = index_.find(*point);
    if (it != index_.end() && it->second->pins == 0 && !it->second->moving) EvictLocked(it->second.get());
  }
}

void BlockStore::DropLocked(Entry* e) {
  Tier& t = *tiers_[e->tier];
  UnlinkLocked(e);
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

absl::Status BlockStore::MakeRoomLocked(size_t tier, size_t bytes, const std::string& segment_owner,
                                        const std::string& owner) {
  const auto tier_name = [&] { return kvblock::TierName(static_cast<v1::Tier>(tiers_[tier]->counters.tier)); };
  const uint64_t taken = tiers_[tier]->storage->BytesTaken(bytes);
  const uint64_t charged = taken + kBookkeepingBytesPerBlock;
  auto book = owners_.find(owner);
  if (const uint64_t limit = book == owners_.end() ? 0 : book->second.quota.tier_bytes[tier]; limit > 0) {
    // Over its quota, an owner makes room out of its own blocks only.
    const auto over_quota = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto b = owners_.find(owner);  // looked up again: moves let go of the lock
      return b != owners_.end() && ChargedLocked(b->second, tier, segment_owner, taken) + charged > limit;
    };
    if (charged > limit ||
        !FreeWhileLocked(tier, bytes, over_quota, [&](const Entry& e) { return e.owner == owner; })) {
      return absl::ResourceExhaustedError(
          absl::StrCat("tenant ", owner, "'s quota of ", limit, " bytes in the ", tier_name(),
                       " tier is all pinned or incomplete blocks, and the free room of the segments they keep"));
    }
  }
  const auto short_of_room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !HasRoomLocked(tier, bytes, segment_owner);
  };
  // The asker's own blocks, and those of owners over their quota or with
  // none, go first; an owner within its quota loses blocks only when the
  // quotas add up to more than the tier holds.
  if (FreeWhileLocked(tier, bytes, short_of_room,
                      [&](const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                        return e.owner == owner || !WithinQuotaLocked(e.owner, tier);
                      }) ||
      FreeWhileLocked(tier, bytes, short_of_room, [](const Entry&) { return true; })) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(tier_name(), " tier is full of pinned or incomplete blocks"));
}

bool BlockStore::FreeWhileLocked(size_t tier, size_t bytes, const std::function<bool()>& short_of_room,
                                 const std::function<bool(const Entry&)>& eligible) {
  Tier& t = *tiers_[tier];
  const bool demotes = tier + 1 < tiers_.size();
  // Victims taken at a time: a batch to demote, or the one to evict.
  const uint64_t victims_bytes =
      demotes ? std::max<uint64_t>(bytes, t.storage->MoveBatchBytes(t.counters.capacity_bytes)) : 1;
  // In the policy's order among the eligible: in a shared arena another
  // segment owner's victim makes room only once its segment empties, so
  // this may move more than `bytes`.
  while (short_of_room()) {
    const std::vector<Entry*> victims = VictimsLocked(tier, victims_bytes, eligible);
    if (victims.empty()) return false;
    if (!demotes) {
      EvictLocked(victims[0]);
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
      if (moved[i] || dropped || read_meanwhile || !short_of_room()) continue;
      EvictLocked(v);
    }
  }
  return true;
}

}  // namespace kvtier::cache
