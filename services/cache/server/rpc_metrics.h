// What the cache's RPCs did: latency histograms by method and status, and
// per tenant the blocks asked for that were found or not and the requests
// refused, by reason. Tenants are the callers the tenants file names (or
// "" without one), so the labels stay bounded. Thread-safe.
#ifndef KVTIER_SERVICES_CACHE_SERVER_RPC_METRICS_H_
#define KVTIER_SERVICES_CACHE_SERVER_RPC_METRICS_H_

#include <grpcpp/support/status.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kvtier::cache {

class RpcMetrics {
 public:
  // Registers kvtier_cache_rpc_duration_seconds{method,code},
  // kvtier_cache_match_blocks_total{result},
  // kvtier_cache_tenant_hits_total{tenant}, ..._misses_total{tenant} and
  // kvtier_cache_tenant_denied_total{tenant,reason} in `registry`.
  explicit RpcMetrics(prometheus::Registry& registry);
  void Observe(const std::string& method, grpc::StatusCode code, absl::Duration elapsed);
  // Blocks of a Get by `tenant`: found and not.
  void CountBlocks(const std::string& tenant, uint64_t hits, uint64_t misses);
  // A Match by `tenant` that found the first `matched` of `asked` blocks:
  // the rest are misses (a cold prompt is all misses), for the tenant and
  // in kvtier_cache_match_blocks_total, the hit ratio of prompt prefixes.
  void CountMatch(const std::string& tenant, uint64_t matched, uint64_t asked);
  // A request refused: counted when `status` is a refusal (UNAUTHENTICATED,
  // PERMISSION_DENIED, RESOURCE_EXHAUSTED), under its code as the reason.
  void CountDenied(const std::string& tenant, const absl::Status& status);

 private:
  prometheus::Family<prometheus::Histogram>& family_;
  prometheus::Family<prometheus::Counter>& hits_;
  prometheus::Family<prometheus::Counter>& misses_;
  prometheus::Family<prometheus::Counter>& denied_;
  prometheus::Family<prometheus::Counter>& match_blocks_;
  prometheus::Counter& match_hits_;
  prometheus::Counter& match_misses_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_SERVER_RPC_METRICS_H_
