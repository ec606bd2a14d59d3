// A cache shard's bulk stream (services/cache/bulk_stream.h), as a reader
// of its blocks uses it: the port learned from the shard's Stats, idle
// connections kept for the next Fetch, and after a failure (the cache
// restarted, or does not serve one) no new try for a while, Get serving
// meanwhile. Thread-safe.
#ifndef KVTIER_SERVICES_SERVING_BULK_CONNECTIONS_H_
#define KVTIER_SERVICES_SERVING_BULK_CONNECTIONS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/cache/bulk_client.h"
#include "services/cache/cache_client.h"

namespace kvtier::serving {

class BulkConnections {
 public:
  static constexpr size_t kIdle = 4;  // idle connections kept
  // An idle connection older than this is closed rather than reused: the
  // cache closes those idle for 10 minutes, and a reused one found closed
  // would send its Fetch to Get.
  static constexpr absl::Duration kMaxIdle = absl::Minutes(1);
  // `target`: the shard's gRPC host:port; `client` (not owned) asks it for
  // Stats. `io_timeout` bounds each wait of a bulk read.
  BulkConnections(std::string target, cache::CacheClient* client, absl::Duration io_timeout)
      : target_(std::move(target)), client_(client), io_timeout_(io_timeout) {}

  // An idle connection or a new one; null when the shard has no bulk
  // stream, or it failed lately.
  std::unique_ptr<cache::BulkClient> Take();
  // Back for the next Fetch; a broken one is dropped, and the port is
  // asked for again after a pause (a restarted cache may have another).
  void Give(std::unique_ptr<cache::BulkClient> connection);

 private:
  const std::string target_;
  cache::CacheClient* const client_;
  const absl::Duration io_timeout_;
  absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);  // empty: not known
  absl::Time retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  struct Idle {
    std::unique_ptr<cache::BulkClient> connection;
    absl::Time since;
  };
  std::vector<Idle> idle_ ABSL_GUARDED_BY(mu_);  // the most recent last
};

}  // namespace kvtier::serving

#endif  // KVTIER_SERVICES_SERVING_BULK_CONNECTIONS_H_
