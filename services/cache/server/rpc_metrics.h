// Per-RPC latency histograms, observed by the cache service's reactors.
// Thread-safe.
#ifndef KVTIER_SERVICES_CACHE_SERVER_RPC_METRICS_H_
#define KVTIER_SERVICES_CACHE_SERVER_RPC_METRICS_H_

#include <grpcpp/support/status.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <string>

#include "absl/time/time.h"

namespace kvtier::cache {

class RpcMetrics {
 public:
  // Registers kvtier_cache_rpc_duration_seconds{method,code} in `registry`.
  explicit RpcMetrics(prometheus::Registry& registry);
  void Observe(const std::string& method, grpc::StatusCode code, absl::Duration elapsed);

 private:
  prometheus::Family<prometheus::Histogram>& family_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_SERVER_RPC_METRICS_H_
