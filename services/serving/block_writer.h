// Writes whole blocks to the cache shards in the background, so that a
// decode step never waits on the network: the decode worker's write-back of
// blocks that fill during generation. Best effort: a block that cannot be
// stored is only counted (the next reader recomputes it). Thread-safe.
#ifndef KVTIER_SERVICES_SERVING_BLOCK_WRITER_H_
#define KVTIER_SERVICES_SERVING_BLOCK_WRITER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "services/serving/shard_set.h"

namespace kvtier::serving {

class BlockWriter {
 public:
  BlockWriter(ShardSet& shards, size_t max_queued);
  ~BlockWriter();  // writes what is queued, then stops

  // Queues one all-layer record; false (and dropped) when the queue is full.
  bool Enqueue(const std::string& ns, const kvblock::LatentLayout& layout, const kvblock::BlockHash& hash,
               std::string record);
  // Blocks the shards stored / could not store so far.
  uint64_t stored() const;
  uint64_t failed() const;
  // Waits until everything queued so far has been attempted (tests, shutdown).
  void Flush();

 private:
  struct Item {
    std::string ns;
    kvblock::LatentLayout layout;
    kvblock::BlockHash hash;
    std::string record;
  };
  void Loop();

  ShardSet& shards_;
  const size_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t stored_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace kvtier::serving

#endif  // KVTIER_SERVICES_SERVING_BLOCK_WRITER_H_
