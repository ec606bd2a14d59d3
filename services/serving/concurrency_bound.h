// How many calls one key (a tenant, a client's address) may have under way
// at once, so that one client holding hundreds of generations open cannot
// take every place a server has. Thread-safe.
#ifndef KVTIER_SERVICES_SERVING_CONCURRENCY_BOUND_H_
#define KVTIER_SERVICES_SERVING_CONCURRENCY_BOUND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::serving {

class ConcurrencyBound {
 public:
  // `what` names the bound in errors ("generations of tenant"), `flag` the
  // flag that sets `most`.
  ConcurrencyBound(uint64_t most, std::string what, std::string flag)
      : most_(most), what_(std::move(what)), flag_(std::move(flag)) {}
  ConcurrencyBound(const ConcurrencyBound&) = delete;
  ConcurrencyBound& operator=(const ConcurrencyBound&) = delete;

  // One of `key`'s places, given back when the hold is let go (it must not
  // outlive this bound); RESOURCE_EXHAUSTED naming the key, the bound and
  // its flag when all are taken.
  absl::StatusOr<std::shared_ptr<void>> Hold(const std::string& key);
  // Places `key` holds now.
  uint64_t Held(const std::string& key);

 private:
  void Release(const std::string& key);

  const uint64_t most_;
  const std::string what_;
  const std::string flag_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint64_t> held_ ABSL_GUARDED_BY(mu_);  // keys that hold some
};

}  // namespace kvtier::serving

#endif  // KVTIER_SERVICES_SERVING_CONCURRENCY_BOUND_H_
