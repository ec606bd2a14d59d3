// The HTTP listener behind /metrics: one thread, every connection
// non-blocking, so a connection that sends nothing (a port scanner, a stuck
// client, a flood of them) costs a file descriptor and never a scrape's
// turn. Each peer address holds a bounded number of connections, the whole
// listener too; a new connection past either bound closes the oldest one
// still waiting for its request, so a flood reopened as fast as it is
// closed cannot keep a scraper out. A connection idle for idle_timeout is
// closed. Answers GET (and HEAD) /metrics with the text exposition format,
// then closes the connection; anything else gets 404 or 405.
#ifndef KVTIER_SERVICES_SERVER_METRICS_HTTP_SERVER_H_
#define KVTIER_SERVICES_SERVER_METRICS_HTTP_SERVER_H_

#include <prometheus/collectable.h>

#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtier {

struct MetricsHttpOptions {
  size_t max_connections = 512;
  size_t max_connections_per_peer = 32;
  absl::Duration idle_timeout = absl::Seconds(2);
};

class MetricsHttpServer {
 public:
  // Listens on `address` (host:port, IPv6 as [::1]:port, port 0: any);
  // UNAVAILABLE with bind(2)'s reason when it cannot.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
      const MetricsHttpOptions& options = {});
  // Closes the listener and every connection.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  struct Connection;
  MetricsHttpServer(int listener, int port, int wake,
                    std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
                    const MetricsHttpOptions& options);
  void Loop();

  const int listener_;
  const int port_;
  const int wake_;  // eventfd: stops the loop
  const std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  const MetricsHttpOptions options_;
  std::thread thread_;
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_SERVER_METRICS_HTTP_SERVER_H_
