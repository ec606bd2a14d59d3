// Writes whole blocks to the cache shards in the background, so that a
// decode step never waits on the network: the decode worker's write-back of
// blocks that fill during generation. Best effort: a block that cannot be
// stored is only counted (the next reader recomputes it). Thread-safe.
#ifndef KVTIER_SERVICES_CACHE_CLIENT_BLOCK_WRITER_H_
#define KVTIER_SERVICES_CACHE_CLIENT_BLOCK_WRITER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "services/cache/client/shard_set.h"

namespace kvtier::cache {

class BlockWriter {
 public:
  BlockWriter(ShardSet& shards, size_t max_queued);
  ~BlockWriter();  // writes what is queued, then stops

  // Queues one all-layer record, stored for end tenant `acting_for` (empty:
  // this process's own); returns its ticket, or 0 when the queue is full
  // and the record was dropped.
  // `shard_key`, when set, places the record on that key's shard (a V4
  // restore point beside its block).
  uint64_t Enqueue(const std::string& ns, const kvblock::LatentLayout& layout, const kvblock::BlockHash& hash,
                   std::string record, const std::string& acting_for = {},
                   const std::optional<kvblock::BlockHash>& shard_key = std::nullopt);
  // Waits until the record of `ticket`, and every one queued before it,
  // was attempted (writes go in queue order).
  void WaitFor(uint64_t ticket);
  // Runs `then` once that is so: at once on this thread if it is already,
  // else on the writer's thread right after.
  void WhenAttempted(uint64_t ticket, std::function<void()> then);

 private:
  struct Item {
    std::string ns;
    kvblock::LatentLayout layout;
    kvblock::BlockHash hash;
    std::string record;
    std::string acting_for;
    std::optional<kvblock::BlockHash> shard_key;
  };
  void Loop();

  ShardSet& shards_;
  const size_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;                                     // tickets handed out
  uint64_t attempted_ ABSL_GUARDED_BY(mu_) = 0;                                  // records written or failed
  std::multimap<uint64_t, std::function<void()>> waiting_ ABSL_GUARDED_BY(mu_);  // by ticket
  std::thread thread_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_CLIENT_BLOCK_WRITER_H_
