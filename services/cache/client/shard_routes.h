// The ways a reader reaches one cache shard's blocks. A shard has an ordered
// list of routes (ShardSet): the same-host fast path first where it is on,
// gRPC last. Each route answers what it can and hands back, by index, what
// it leaves for the next one; the last route answers everything, with the
// shard's error where it failed. Every record given to a caller lands and
// is checked in one place (RecordLanding).
#ifndef KVTIER_SERVICES_CACHE_CLIENT_SHARD_ROUTES_H_
#define KVTIER_SERVICES_CACHE_CLIENT_SHARD_ROUTES_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/cache/client/raw_get.h"
#include "services/cache/client/record_pool.h"
#include "services/cache/client/shared_record.h"
#include "services/cache/client/stream_connections.h"
#include "services/cache/fast_path/fast_path_client.h"
#include "services/kvblock/block_format.h"

namespace kvtier::cache {

// Where one route call's records land: slot i answers block i of the call.
// Only whole records of the layout, at indices asked for, get room (an
// empty span refuses one), so a server's answer cannot make this side
// allocate what it likes; a record is handed on only once written whole and
// checked, so what a pooled string held before never shows. Not
// thread-safe (a route calls it from one thread at a time).
class RecordLanding {
 public:
  RecordLanding(const kvblock::LatentLayout& layout, RecordPool& pool,
                std::vector<absl::StatusOr<SharedRecord>*> slots);

  size_t size() const { return slots_.size(); }
  // The most bytes one record of the layout takes.
  size_t record_bytes() const { return record_bytes_; }
  // Room for block `index`'s record of `size` bytes (empty: refused).
  std::span<uint8_t> Destination(uint32_t index, size_t size);
  // An answer for block `index`: its record, now in its Destination, or
  // why there is none. `crc` says whether the route checked the record's
  // CRC32C as it copied it (else it is checked here, just landed and still
  // in the CPU's cache).
  void Deliver(const cache::RawBlock& block, kvblock::CrcCheck crc);
  // Every block not answered yet gets `status`.
  void FailUnanswered(const absl::Status& status);
  // Blocks [begin, end) of this landing as a landing of their own, for a
  // call that asks for only those (its block 0 is this one's `begin`).
  // Landings of runs that do not overlap may be used by threads of their
  // own; this one must have had nothing land and is not used again.
  RecordLanding Run(size_t begin, size_t end) const;

  cache::RecordDestination AsDestination() {
    return [this](uint32_t index, size_t size) { return Destination(index, size); };
  }

 private:
  RecordLanding(const kvblock::LatentLayout& layout, RecordPool& pool, size_t record_bytes,
                std::vector<absl::StatusOr<SharedRecord>*> slots);

  const kvblock::LatentLayout& layout_;
  RecordPool& pool_;
  const size_t record_bytes_;  // a record's size; for DeepSeek-V4 the most one takes
  std::vector<absl::StatusOr<SharedRecord>*> slots_;
  std::vector<std::shared_ptr<std::string>> landed_;
  std::vector<bool> answered_;
};

// One way to one shard. Thread-safe.
class ShardRoute {
 public:
  virtual ~ShardRoute() = default;
  // Reads `hashes` of `ns` into `landing` (block i is hashes[i]) and returns
  // the indices it did not answer, for the next route; for end tenant
  // `acting_for` where the route calls the cache (not empty).
  virtual std::vector<uint32_t> Fetch(const std::string& ns, const kvblock::LatentLayout& layout,
                                      const std::vector<kvblock::BlockHash>& hashes, RecordLanding& landing,
                                      const std::string& acting_for) = 0;
  // A same-host session through whose staging region a Put stream's records
  // can travel, or null (they go inline). A call that failed through it as
  // if the session were gone reports it with SessionFailed: the next use
  // opens a new one.
  virtual std::shared_ptr<FastPathClient> PutStaging() { return nullptr; }
  virtual void SessionFailed(const std::shared_ptr<FastPathClient>& /*session*/) {}
};

// The same-host fast path (services/cache/fast_path/fast_path.md): records copied out of the cache's
// shared segments, or its GPU tier through CUDA IPC. The session is opened
// on first use; a route that cannot open one (another host, a cache without
// it) answers nothing and asks again now and then, since a restarted cache
// may have one. Blocks it cannot serve (outside shared memory, a segment it
// cannot map) and everything of a call that failed go to the next route.
class FastPathRoute : public ShardRoute {
 public:
  FastPathRoute(std::shared_ptr<grpc::Channel> channel, absl::Duration deadline)
      : channel_(std::move(channel)), deadline_(deadline) {}

  std::vector<uint32_t> Fetch(const std::string& ns, const kvblock::LatentLayout& layout,
                              const std::vector<kvblock::BlockHash>& hashes, RecordLanding& landing,
                              const std::string& acting_for) override;
  std::shared_ptr<FastPathClient> PutStaging() override;
  void SessionFailed(const std::shared_ptr<FastPathClient>& session) override;
  static constexpr uint64_t kStagingBytes = 32 << 20;

 private:
  // The open session, or null (none now, and not asked again yet).
  std::shared_ptr<FastPathClient> Session();

  const std::shared_ptr<grpc::Channel> channel_;
  const absl::Duration deadline_;
  absl::Mutex mu_;
  std::shared_ptr<FastPathClient> session_ ABSL_GUARDED_BY(mu_);
  absl::Time retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// gRPC Get, each record landing straight from gRPC's buffers (RawGet). A
// read of a few blocks is one stream on the least busy of the shard's
// connections; a larger one is cut into consecutive runs of at least
// kStreamBytes, up to `streams` of them and no more than there are
// connections carrying no stream, each a stream of its own read at once:
// one connection carries about what one core receives (and, with TLS,
// decrypts). The last route: it answers every block, with the shard's
// error where a stream failed (blocks that arrived before it, and other
// runs', stay usable).
class GrpcRoute : public ShardRoute {
 public:
  // `streams`: 1 to StreamConnections::kConnections.
  GrpcRoute(std::string target, StreamConnections* connections, absl::Duration deadline, size_t streams)
      : target_(std::move(target)), connections_(connections), deadline_(deadline), streams_(streams) {}

  std::vector<uint32_t> Fetch(const std::string& ns, const kvblock::LatentLayout& layout,
                              const std::vector<kvblock::BlockHash>& hashes, RecordLanding& landing,
                              const std::string& acting_for) override;
  static constexpr size_t kStreamBytes = size_t{8} << 20;

 private:
  // One stream for all of `hashes`.
  void FetchRun(const std::string& ns, const kvblock::LatentLayout& layout,
                const std::vector<kvblock::BlockHash>& hashes, RecordLanding& landing, const std::string& acting_for);

  const std::string target_;
  StreamConnections* const connections_;
  const absl::Duration deadline_;
  const size_t streams_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_CLIENT_SHARD_ROUTES_H_
