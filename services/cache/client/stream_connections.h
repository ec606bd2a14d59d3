// A few HTTP/2 connections of one process's own to one cache shard, for its
// long streams (Fetch's Gets, ShardedPut's Puts). One connection carries
// about one stream's rate, and gRPC gives every channel to the same target
// the one connection; so concurrent streams (a worker loading several
// sequences, a prefill node storing several) that shared it were held to
// it. A stream takes the connection with the fewest streams, the first on a
// tie: a lone stream keeps to one, warm. Thread-safe.
#ifndef KVTIER_SERVICES_CACHE_CLIENT_STREAM_CONNECTIONS_H_
#define KVTIER_SERVICES_CACHE_CLIENT_STREAM_CONNECTIONS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "kvtier/v1/cache.grpc.pb.h"

namespace kvtier::cache {

class StreamConnections {
 public:
  static constexpr size_t kConnections = 4;
  // Channels are made now; gRPC connects each on its first call.
  explicit StreamConnections(const std::string& target);

  // One connection, counted as carrying one more stream until the lease
  // is destroyed.
  class Lease {
   public:
    Lease(Lease&& other) noexcept : owner_(other.owner_), index_(other.index_) { other.owner_ = nullptr; }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    grpc::Channel* channel() const { return owner_->channels_[index_].get(); }
    v1::KvCache::Stub& stub() const { return *owner_->stubs_[index_]; }

   private:
    friend class StreamConnections;
    Lease(StreamConnections* owner, size_t index) : owner_(owner), index_(index) {}
    StreamConnections* owner_;
    size_t index_;
  };
  Lease Take();
  // How many connections carry no stream now.
  size_t Unused();

  // Lets every connection try again now, not after gRPC's reconnect
  // backoff (which grows to minutes while a shard is away).
  void ResetBackoff();

 private:
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::KvCache::Stub>> stubs_;
  absl::Mutex mu_;
  std::vector<int> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_CLIENT_STREAM_CONNECTIONS_H_
