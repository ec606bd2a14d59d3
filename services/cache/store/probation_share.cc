#include "services/cache/store/probation_share.h"

#include <algorithm>

namespace kvtier::cache {

void ProbationShare::Ghosts::Add(uint64_t fingerprint, size_t bound) {
  Take(fingerprint);  // evicted again: remembered as of now
  order_.push_back(fingerprint);
  where_[fingerprint] = std::prev(order_.end());
  while (order_.size() > std::max<size_t>(bound, 1)) {
    where_.erase(order_.front());
    order_.pop_front();
  }
}

bool ProbationShare::Ghosts::Contains(uint64_t fingerprint) const { return where_.contains(fingerprint); }

bool ProbationShare::Ghosts::Take(uint64_t fingerprint) {
  auto it = where_.find(fingerprint);
  if (it == where_.end()) return false;
  order_.erase(it->second);
  where_.erase(it);
  return true;
}

size_t ProbationShare::Ghosts::MemoryBytes() const {
  constexpr size_t kListNode = 3 * sizeof(void*);
  return order_.size() * kListNode + where_.capacity() * (sizeof(uint64_t) + sizeof(void*) + 1);
}

bool ProbationShare::Returning(uint64_t fingerprint, size_t held_blocks) {
  const double unit = 1.0 / static_cast<double>(std::max<size_t>(held_blocks, 1));
  // ARC's step: larger when the other kind of return is the more common.
  const auto step = [&](const Ghosts& other, const Ghosts& mine) {
    return unit * static_cast<double>(std::max<size_t>(1, other.size() / std::max<size_t>(mine.size(), 1)));
  };
  if (evicted_on_probation_.Contains(fingerprint)) {
    share_ = std::min(1.0, share_ + step(evicted_used_, evicted_on_probation_));
    evicted_on_probation_.Take(fingerprint);
    return true;
  }
  if (evicted_used_.Contains(fingerprint)) {
    share_ = std::max(floor_, share_ - step(evicted_on_probation_, evicted_used_));
    evicted_used_.Take(fingerprint);
    return true;
  }
  return false;
}

void ProbationShare::Evicted(uint64_t fingerprint, bool on_probation, size_t held_blocks) {
  (on_probation ? evicted_on_probation_ : evicted_used_).Add(fingerprint, held_blocks);
}

size_t ProbationShare::MemoryBytes() const { return evicted_on_probation_.MemoryBytes() + evicted_used_.MemoryBytes(); }

}  // namespace kvtier::cache
