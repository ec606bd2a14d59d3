#include "services/cache/store/ghosts.h"

#include <algorithm>

namespace kvtier::cache {

void Ghosts::Add(uint64_t fingerprint, size_t bound, double value) {
  Take(fingerprint);
  order_.emplace_back(fingerprint, value);
  where_[fingerprint] = std::prev(order_.end());
  while (order_.size() > std::max<size_t>(bound, 1)) {
    where_.erase(order_.front().first);
    order_.pop_front();
  }
}

std::optional<double> Ghosts::Take(uint64_t fingerprint) {
  auto it = where_.find(fingerprint);
  if (it == where_.end()) return std::nullopt;
  const double value = it->second->second;
  order_.erase(it->second);
  where_.erase(it);
  return value;
}

size_t Ghosts::MemoryBytes() const {
  constexpr size_t kListNode = 2 * sizeof(void*) + sizeof(std::pair<uint64_t, double>);
  return order_.size() * kListNode + where_.capacity() * (sizeof(uint64_t) + sizeof(void*) + 1);
}

}  // namespace kvtier::cache
