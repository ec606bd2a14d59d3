// The cache tier as several shards (kvtier-cache servers): each block lives
// on the shard chosen by rendezvous hashing of its key, so adding a shard
// moves only about 1/N of the keys. A shard that is down, slow (deadline) or
// answers a miss only makes its blocks look absent: callers recompute them.
// The shards can change while in use (SetTargets, from discovery). ShardSet
// only routes: each shard's blocks travel by its own ordered list
// of ShardRoutes (shard_routes.h). Thread-safe.
#ifndef KVTIER_SERVICES_CACHE_CLIENT_SHARD_SET_H_
#define KVTIER_SERVICES_CACHE_CLIENT_SHARD_SET_H_

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "services/cache/client/cache_client.h"
#include "services/cache/client/put_route.h"
#include "services/cache/client/record_pool.h"
#include "services/cache/client/shard_routes.h"
#include "services/cache/client/shared_record.h"
#include "services/cache/client/stream_connections.h"

namespace kvtier::cache {

class ShardSet {
 public:
  // No shards until SetTargets. Every call to a shard gets `deadline`.
  // With `fast_path`, blocks of a shard on this host are read through its
  // shared memory (FastPathRoute); the rest come by Get (GrpcRoute), a
  // large read of one shard's blocks in up to `fetch_streams` streams at
  // once (at most StreamConnections::kConnections; 0: one for every four
  // cores this process may use, UsableCpus). At most `idle_record_bytes`
  // of fetched records are kept for reuse once let go.
  explicit ShardSet(absl::Duration deadline, bool fast_path = true, size_t idle_record_bytes = kIdleRecordBytes,
                    size_t fetch_streams = 0);
  ~ShardSet();
  // A fixed list: `targets` as ParseTargetList takes it.
  static absl::StatusOr<std::unique_ptr<ShardSet>> Create(const std::string& targets, absl::Duration deadline,
                                                          bool fast_path = true,
                                                          size_t idle_record_bytes = kIdleRecordBytes,
                                                          size_t fetch_streams = 0);
  // INVALID_ARGUMENT unless `fetch_streams` is one the constructor takes
  // as it is: 0 to StreamConnections::kConnections.
  static absl::Status CheckFetchStreams(uint64_t fetch_streams);

  // Makes `targets` ("host:port" each, no repeats) the shards. A shard in
  // both the old and new lists keeps its connections and health; a new
  // one takes about 1/N of the keys; a removed one's blocks become misses
  // (calls already under way on it finish).
  absl::Status SetTargets(const std::vector<std::string>& targets);

  size_t size() const { return Members()->size(); }
  // The target of the shard that holds `hash` (rendezvous hashing: the
  // highest score); empty with no shards.
  std::string ShardOf(const kvblock::BlockHash& hash) const;

  // Health-checks every shard at once (grpc.health.v1 over its channel,
  // with the deadline, after up to a second or the deadline for a channel
  // still connecting) and logs each change with its reason. A shard found
  // down is not called again until a check finds it up: its blocks are
  // misses at once instead of after a deadline. StartHealthChecks does this
  // every `interval` on a thread of its own, until the set is destroyed.
  void CheckHealth();
  void StartHealthChecks(absl::Duration interval);
  enum class Health { kUnknown, kUp, kDown };  // kUnknown: not checked yet
  std::vector<std::pair<std::string, Health>> HealthOfShards() const;

  // Each call below is for end tenant `acting_for` when it is not empty
  // (kActingForMetadata: the cache holds it to that tenant's quota, role and
  // namespaces); else for this process's own identity. Reads through the
  // fast path go through this process's session either way.

  // How many leading blocks of `chain` are stored, asking each shard about
  // its own blocks at once; a shard that fails holds none. For a DeepSeek-
  // V4 layout, the longest such prefix that ends at a block whose restore
  // point is stored (a point is written to its block's shard: shard_key).
  size_t MatchPrefix(const std::string& ns, const kvblock::LatentLayout& layout,
                     const std::vector<kvblock::BlockHash>& chain, const std::string& acting_for = {});

  // Reads `hashes` (all shards at once), each record landing straight in its
  // string: each shard's routes are tried in turn, each asked for what the
  // one before left. Each answer is the record, or why there is none (a
  // miss, DATA_LOSS, or the shard's error). Every record given has had its
  // CRC checked (as it was copied or as it landed); the strings come from a
  // pool and go back to it when their last holder lets go. `shard_keys`,
  // when not empty, says where each record is: hashes[i] on the shard of
  // shard_keys[i].
  std::vector<absl::StatusOr<SharedRecord>> Fetch(const std::string& ns, const kvblock::LatentLayout& layout,
                                                  const std::vector<kvblock::BlockHash>& hashes,
                                                  const std::string& acting_for = {},
                                                  const std::vector<kvblock::BlockHash>& shard_keys = {});
  // The default of the most bytes of fetched records that stay in the
  // pool unheld.
  static constexpr size_t kIdleRecordBytes = size_t{512} << 20;
  // Where Fetch's records come from (for its metrics).
  std::shared_ptr<const RecordPool> records() const { return records_; }

  // Stores whole-block records, one Put per shard (a ShardedPut); the
  // hashes stored (or already there).
  std::set<kvblock::BlockHash> Store(const std::string& ns, const kvblock::LatentLayout& layout,
                                     const std::vector<BlockSlices>& blocks, const std::string& acting_for = {});

  // What a ShardedPut writes through: each shard's Put route as the put
  // begins, and which of them holds a hash.
  struct PutTargets {
    std::vector<std::shared_ptr<PutRoute>> shards;
    std::function<size_t(const kvblock::BlockHash&)> shard_of;
  };
  PutTargets ForPut() const;

 private:
  struct Shard;
  // The shards at one moment: a call works on one such list throughout,
  // whatever SetTargets does meanwhile.
  using ShardList = std::vector<std::shared_ptr<Shard>>;
  std::shared_ptr<const ShardList> Members() const;
  static size_t IndexOf(const ShardList& shards, const kvblock::BlockHash& hash);
  // Indices of `hashes` on each shard of `shards`, in order.
  static std::vector<std::vector<size_t>> ByShard(const ShardList& shards,
                                                  const std::vector<kvblock::BlockHash>& hashes);
  // Fetch's part for one shard: `indices` of `hashes` into `out`.
  void FetchFromShard(Shard& shard, const std::string& ns, const kvblock::LatentLayout& layout,
                      const std::vector<kvblock::BlockHash>& hashes, std::vector<size_t> indices,
                      std::vector<absl::StatusOr<SharedRecord>>& out, const std::string& acting_for);

  const absl::Duration deadline_;
  const bool fast_path_;
  const size_t fetch_streams_;
  const std::shared_ptr<RecordPool> records_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const ShardList> members_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_health_checks_;
  std::thread health_checks_;
};

// Layer slices streamed to the blocks' shards as they are computed: one Put
// stream per shard (put_route.h), opened on its first slice. Each shard
// gets `finish_deadline` to confirm after the last slice, and is cancelled
// (its blocks not stored) if it does not. A shard whose stream fails takes
// no more writes; its blocks are reported as not stored. Not thread-safe.
class ShardedPut {
 public:
  // For end tenant `acting_for` when not empty (ShardSet's calls);
  // `cold_start`: PutHeader's (IsColdStart, put_wire.h).
  ShardedPut(ShardSet& shards, std::string ns, const kvblock::LatentLayout& layout, absl::Duration finish_deadline,
             std::string acting_for = {}, bool cold_start = false);
  ~ShardedPut();

  // PutStream::Write to the shard of `hash` (or of `shard_key` when set);
  // the record is not copied.
  void Write(const kvblock::BlockHash& hash, std::shared_ptr<const std::string> record,
             const std::optional<kvblock::BlockHash>& shard_key = std::nullopt);
  void Write(const kvblock::BlockHash& hash, std::string record,
             const std::optional<kvblock::BlockHash>& shard_key = std::nullopt) {
    Write(hash, std::make_shared<const std::string>(std::move(record)), shard_key);
  }
  void Flush();
  // Ends every stream; the hashes now stored (or that were already there).
  std::set<kvblock::BlockHash> Finish();

 private:
  const ShardSet::PutTargets targets_;  // the shards when the put began
  std::string ns_;
  kvblock::LatentLayout layout_;
  absl::Duration finish_deadline_;
  std::string acting_for_;
  bool cold_start_;
  std::vector<std::unique_ptr<PutStream>> streams_;  // by shard
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_CLIENT_SHARD_SET_H_
