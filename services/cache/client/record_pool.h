// Strings for fetched block records, used again once nothing holds them. A
// worker fetches a cached prefix for every request it takes, and landing it
// in fresh memory costs more than the copy itself: every new page faults in
// as it is first written (docs/notes/2026-12-01-benchmark-history.md, "A
// prefix loaded as a worker loads it"). Thread-safe; lives as long as any
// string it handed out.
#ifndef KVTIER_SERVICES_CACHE_CLIENT_RECORD_POOL_H_
#define KVTIER_SERVICES_CACHE_CLIENT_RECORD_POOL_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::cache {

class RecordPool : public std::enable_shared_from_this<RecordPool> {
 public:
  // Keeps at most `max_idle_bytes` of strings nobody holds; beyond that,
  // returned strings are freed.
  static std::shared_ptr<RecordPool> Create(size_t max_idle_bytes);

  // A string of `size` bytes whose contents are whatever it held last (the
  // caller overwrites all of them); back to the pool when the last holder
  // lets go.
  std::shared_ptr<std::string> Take(size_t size);

  // Bytes kept for reuse, and bytes handed out and not yet let go.
  size_t idle_bytes() const;
  size_t held_bytes() const;

 private:
  explicit RecordPool(size_t max_idle_bytes) : max_idle_bytes_(max_idle_bytes) {}
  void Return(std::string* record, size_t taken_size);

  const size_t max_idle_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<std::unique_ptr<std::string>>> idle_ ABSL_GUARDED_BY(mu_);  // by size
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_CLIENT_RECORD_POOL_H_
