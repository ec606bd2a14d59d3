// How Put streams reach one shard. ShardedPut opens one stream per shard it
// writes to; each goes over one of the shard's stream connections, its
// slices staged in the shard's same-host fast path session when there is
// one (else inline in the messages), many slices to a message.
#ifndef KVTIER_SERVICES_CACHE_CLIENT_PUT_ROUTE_H_
#define KVTIER_SERVICES_CACHE_CLIENT_PUT_ROUTE_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kvtier/v1/cache.grpc.pb.h"
#include "services/cache/client/put_wire.h"
#include "services/cache/client/shard_routes.h"
#include "services/cache/client/stream_connections.h"
#include "services/cache/fast_path/fast_path_client.h"
#include "services/kvblock/block_key.h"
#include "services/kvblock/layout.h"

namespace kvtier::cache {

class PutStream;

// Thread-safe; the routes it is given outlive it.
class PutRoute {
 public:
  // `connections`: the shard's; `read_routes`: the shard's, one of which may
  // lend its fast path session's staging region; `down`: whether the shard
  // failed its last health check.
  PutRoute(StreamConnections* connections, const std::vector<std::unique_ptr<ShardRoute>>* read_routes,
           std::function<bool()> down)
      : connections_(connections), read_routes_(read_routes), down_(std::move(down)) {}

  // A Put stream of blocks of `ns` in `layout`, for end tenant `acting_for`
  // when not empty, its header (with `cold_start`) sent at once; null while
  // the shard is down.
  std::unique_ptr<PutStream> Open(const std::string& ns, const kvblock::LatentLayout& layout,
                                  const std::string& acting_for, bool cold_start);

 private:
  StreamConnections* const connections_;
  const std::vector<std::unique_ptr<ShardRoute>>* const read_routes_;
  const std::function<bool()> down_;
};

// One Put stream to one shard. A stream lives as long as the computation
// feeding it, so it has no deadline of its own: whoever finishes it cancels
// it if the answer is late. Write and Flush from one thread; Finish from any
// one thread after them, Cancel from any thread at any time.
class PutStream {
 public:
  ~PutStream();

  // Sends `record` of block `hash`: through the staging region when there
  // is room in it, else inline, as a slice over the string itself (no copy:
  // put_wire.h); batched, on Flush, Finish, or once a message
  // holds kSlicesPerMessage slices or kInlineBytesPerMessage inline bytes.
  // One message per slice cost the cache a hand-off each; inline, about a
  // block a message beat larger ones: the cache applies one message while
  // the next arrives (cache_bench, load/README.md). Nothing once the stream
  // has failed.
  void Write(const kvblock::BlockHash& hash, std::shared_ptr<const std::string> record);
  void Flush();
  static constexpr int kSlicesPerMessage = 256;
  static constexpr size_t kInlineBytesPerMessage = 1 << 20;

  // Ends the stream and waits for the cache's answer; the hashes written
  // that the cache stored (or already held).
  std::set<kvblock::BlockHash> Finish();
  void Cancel() { context_.TryCancel(); }

 private:
  friend class PutRoute;
  PutStream() = default;
  void FlushBatch();

  // A local shard's session, from `staging_route`: slices go through its
  // staging region. Declared first so that `staged_` (whose chunks go back
  // once the stream is over) is destroyed before it.
  ShardRoute* staging_route_ = nullptr;
  std::shared_ptr<FastPathClient> fast_;
  std::unique_ptr<FastPathClient::StagedStream> staged_;
  std::optional<StreamConnections::Lease> connection_;
  grpc::ClientContext context_;
  v1::PutResponse response_;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer_;
  bool open_ = false;
  bool finished_ = false;
  std::set<kvblock::BlockHash> written_;
  PutBatchWire batch_;  // slices not sent yet
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_CLIENT_PUT_ROUTE_H_
