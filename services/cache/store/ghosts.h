// Evicted blocks a policy remembers: 64-bit fingerprints of their keys,
// oldest first, each with a value (what the policy knew of the block),
// as many as a bound the caller gives. Not thread-safe: the store calls
// it under its lock.
#ifndef KVTIER_SERVICES_CACHE_STORE_GHOSTS_H_
#define KVTIER_SERVICES_CACHE_STORE_GHOSTS_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace kvtier::cache {

class Ghosts {
 public:
  size_t size() const { return order_.size(); }
  // Remembers a block as the newest (again, if it was), then forgets the
  // oldest beyond `bound` (at least one is kept).
  void Add(uint64_t fingerprint, size_t bound, double value = 0);
  bool Contains(uint64_t fingerprint) const { return where_.contains(fingerprint); }
  // Forgets a block: its value, if it was remembered.
  std::optional<double> Take(uint64_t fingerprint);
  size_t MemoryBytes() const;

 private:
  std::list<std::pair<uint64_t, double>> order_;
  absl::flat_hash_map<uint64_t, std::list<std::pair<uint64_t, double>>::iterator> where_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_GHOSTS_H_
