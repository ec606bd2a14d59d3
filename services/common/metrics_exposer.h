// The Prometheus pull endpoint every kvtier server offers on
// --metrics-listen: serves `collectables` at /metrics and prints
// "metrics on HOST:PORT/metrics" on stdout once bound.
#ifndef KVTIER_SERVICES_COMMON_METRICS_EXPOSER_H_
#define KVTIER_SERVICES_COMMON_METRICS_EXPOSER_H_

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier {

// nullptr for an empty address (metrics off); UNAVAILABLE when the address
// cannot be bound.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsExposer(
    const std::string& address, const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_COMMON_METRICS_EXPOSER_H_
