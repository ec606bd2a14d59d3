// The cache tier as several shards (kvtier-cache servers): each block lives
// on the shard chosen by rendezvous hashing of its key, so adding a shard
// moves only about 1/N of the keys. A shard that is down, slow (deadline) or
// answers a miss only makes its blocks look absent: callers recompute them.
// ShardSet only routes: each shard's blocks travel by its own ordered list
// of ShardRoutes (shard_routes.h). Thread-safe.
#ifndef KVTIER_SERVICES_SERVING_SHARD_SET_H_
#define KVTIER_SERVICES_SERVING_SHARD_SET_H_

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/cache/client/cache_client.h"
#include "services/serving/record_pool.h"
#include "services/serving/shard_routes.h"
#include "services/serving/shared_record.h"
#include "services/serving/stream_connections.h"

namespace kvtier::serving {

class ShardSet {
 public:
  // `targets`: comma-separated host:port list, at least one, no repeats.
  // Every call to a shard gets `deadline`. With `fast_path`, blocks of a
  // shard on this host are read through its shared memory (FastPathRoute);
  // the rest come by Get (GrpcRoute). At most
  // `idle_record_bytes` of fetched records are kept for reuse once let go.
  static absl::StatusOr<std::unique_ptr<ShardSet>> Create(const std::string& targets, absl::Duration deadline,
                                                          bool fast_path = true,
                                                          size_t idle_record_bytes = kIdleRecordBytes);

  size_t size() const { return shards_.size(); }
  const std::string& target(size_t shard) const { return shards_[shard].target; }
  cache::CacheClient& client(size_t shard) { return *shards_[shard].client; }

  // The shard with the highest score for `hash` (rendezvous hashing).
  size_t ShardOf(const kvblock::BlockHash& hash) const;

  // How many leading blocks of `chain` are stored, asking each shard about
  // its own blocks at once; a shard that fails holds none.
  size_t MatchPrefix(const std::string& ns, const kvblock::LatentLayout& layout,
                     const std::vector<kvblock::BlockHash>& chain);

  // Reads `hashes` (all shards at once), each record landing straight in its
  // string: each shard's routes are tried in turn, each asked for what the
  // one before left. Each answer is the record, or why there is none (a
  // miss, DATA_LOSS, or the shard's error). Every record given has had its
  // CRC checked (as it was copied or as it landed); the strings come from a
  // pool and go back to it when their last holder lets go.
  std::vector<absl::StatusOr<SharedRecord>> Fetch(const std::string& ns, const kvblock::LatentLayout& layout,
                                                  const std::vector<kvblock::BlockHash>& hashes);
  // The default of the most bytes of fetched records that stay in the
  // pool unheld.
  static constexpr size_t kIdleRecordBytes = size_t{512} << 20;
  // Where Fetch's records come from (for its metrics).
  std::shared_ptr<const RecordPool> records() const { return records_; }

  // Stores whole-block records, one Put per shard (a ShardedPut); the
  // hashes stored (or already there).
  std::set<kvblock::BlockHash> Store(const std::string& ns, const kvblock::LatentLayout& layout,
                                     const std::vector<cache::BlockSlices>& blocks);

  // Shard `s`'s routes, in the order they are tried.
  const std::vector<std::unique_ptr<ShardRoute>>& routes(size_t s) const { return shards_[s].routes; }

  // A connection to shard `s` for a long stream, of this ShardSet's own
  // (see StreamConnections); the least busy.
  StreamConnections::Lease TakeConnection(size_t s) { return shards_[s].streams->Take(); }

 private:
  // Indices of `hashes` on each shard, in order.
  std::vector<std::vector<size_t>> ByShard(const std::vector<kvblock::BlockHash>& hashes) const;
  // Fetch's part for shard `s`: `indices` of `hashes` into `out`.
  void FetchFromShard(size_t s, const std::string& ns, const kvblock::LatentLayout& layout,
                      const std::vector<kvblock::BlockHash>& hashes, std::vector<size_t> indices,
                      std::vector<absl::StatusOr<SharedRecord>>& out);

  struct Shard {
    std::string target;
    uint64_t seed;                               // from the target: a shard's scores do not depend on the others
    std::unique_ptr<StreamConnections> streams;  // Fetch's Gets, ShardedPut's Puts
    std::unique_ptr<cache::CacheClient> client;
    std::vector<std::unique_ptr<ShardRoute>> routes;  // tried in order; gRPC last
  };
  std::vector<Shard> shards_;
  absl::Duration deadline_;
  std::shared_ptr<RecordPool> records_;
};

// Layer slices streamed to the blocks' shards as they are computed: one Put
// stream per shard, opened on its first slice. A stream lives as long as
// the computation feeding it, so it has no deadline of its own; instead
// each shard gets `finish_deadline` to confirm after the last slice, and is
// cancelled (its blocks not stored) if it does not. A shard whose stream
// fails takes no more writes; its blocks are reported as not stored. Not
// thread-safe.
class ShardedPut {
 public:
  ShardedPut(ShardSet& shards, std::string ns, const kvblock::LatentLayout& layout, absl::Duration finish_deadline);
  ~ShardedPut();

  // Slices are sent many to a message (staged in a local shard's fast path
  // region, else inline): on Flush, Finish, or once a message holds
  // kSlicesPerMessage slices or kInlineBytesPerMessage inline bytes. One
  // message per slice cost the cache a hand-off each; inline, about a block
  // a message beat larger ones: the cache applies one message while the
  // next arrives (cache_bench, load/README.md).
  void Write(const kvblock::BlockHash& hash, const std::string& record);
  void Flush();
  static constexpr int kSlicesPerMessage = 256;
  static constexpr size_t kInlineBytesPerMessage = 1 << 20;
  // Ends every stream; the hashes now stored (or that were already there).
  std::set<kvblock::BlockHash> Finish();

 private:
  struct Stream;
  ShardSet& shards_;
  std::string ns_;
  kvblock::LatentLayout layout_;
  absl::Duration finish_deadline_;
  std::vector<std::unique_ptr<Stream>> streams_;  // by shard
};

}  // namespace kvtier::serving

#endif  // KVTIER_SERVICES_SERVING_SHARD_SET_H_
