// The Prometheus pull endpoint every kvtier server offers on
// --metrics-listen: serves `collectables` and `program`'s process metrics
// (process_metrics.h) at /metrics and prints "metrics on
// HOST:PORT/metrics" on stdout once bound.
#ifndef KVTIER_SERVICES_SERVER_METRICS_EXPOSER_H_
#define KVTIER_SERVICES_SERVER_METRICS_EXPOSER_H_

#include <prometheus/collectable.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/server/metrics_http_server.h"
#include "services/server/process_metrics.h"

namespace kvtier {

// A running endpoint, and the process metrics it serves.
struct MetricsEndpoint {
  std::unique_ptr<MetricsHttpServer> server;  // null: metrics off
  std::shared_ptr<ProcessMetrics> process;
};

// INVALID_ARGUMENT naming --metrics-listen unless `address` is empty
// (metrics off) or HOST:PORT: checked at start, before slow work.
absl::Status CheckMetricsAddress(const std::string& address);

// No exposer for an empty address (metrics off); UNAVAILABLE when the
// address cannot be bound.
absl::StatusOr<MetricsEndpoint> StartMetricsExposer(
    const std::string& program, const std::string& address,
    const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_SERVER_METRICS_EXPOSER_H_
