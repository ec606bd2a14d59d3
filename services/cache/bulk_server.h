// The cache's side of the bulk stream (bulk_stream.h): a TCP listener and
// one thread per connection, which reads a request, then reads, verifies
// and sends one block at a time straight from the store's pages (the
// block stays pinned only while it is sent). A reader that stops reading
// holds its thread until the send timeout, then its connection is closed;
// Get requests keep their leases' meaning (a request's lease ends with it).
// Thread-safe.
#ifndef KVTIER_SERVICES_CACHE_BULK_SERVER_H_
#define KVTIER_SERVICES_CACHE_BULK_SERVER_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/cache/cache_service.h"
#include "services/cache/rpc_metrics.h"

namespace kvtier::cache {

struct BulkServerOptions {
  std::string listen;  // HOST:PORT; port 0 picks a free one
  // Connections beyond this are answered RESOURCE_EXHAUSTED and closed.
  size_t max_connections = 64;
  // A request's bytes, or a block's send, may take this long.
  absl::Duration io_timeout = absl::Seconds(30);
  // A connection waiting for its next request is closed after this.
  absl::Duration idle_timeout = absl::Minutes(10);
};

class BulkServer {
 public:
  // `service` and `metrics` (may be null) must outlive the server.
  static absl::StatusOr<std::unique_ptr<BulkServer>> Start(const BulkServerOptions& options,
                                                           CacheService* service, RpcMetrics* metrics);
  ~BulkServer();
  BulkServer(const BulkServer&) = delete;
  BulkServer& operator=(const BulkServer&) = delete;

  int port() const { return port_; }
  size_t connections() const;  // open now
  // Stops accepting and closes idle connections; requests being answered
  // finish first. Returns once every connection is closed.
  void Shutdown();

 private:
  BulkServer(const BulkServerOptions& options, CacheService* service, RpcMetrics* metrics, int listener,
             int wake, int port);
  void AcceptLoop();
  void JoinFinished();
  void Serve(int fd);
  // Answers one request; false when the connection must close.
  bool Answer(int fd, const std::string& body);
  // Waits for the next request's first byte; false on shutdown, idle
  // timeout or a closed peer.
  bool WaitForRequest(int fd) const;

  const BulkServerOptions options_;
  CacheService* const service_;
  RpcMetrics* const metrics_;
  const int listener_;
  const int wake_;  // eventfd: readable once Shutdown began
  const int port_;
  std::thread acceptor_;
  struct Connection {
    std::thread thread;
    bool done = false;
  };
  mutable absl::Mutex mu_;
  // Finished ones are joined by the acceptor as it goes, the rest by Shutdown.
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_BULK_SERVER_H_
