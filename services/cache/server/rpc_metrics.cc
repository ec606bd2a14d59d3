#include "services/cache/server/rpc_metrics.h"

#include "absl/status/status.h"

namespace kvtier::cache {
namespace {

// 100 us to ~100 s, x2 per bucket: unary lookups to whole-prefix streams.
prometheus::Histogram::BucketBoundaries Buckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 1e-4; v < 120; v *= 2) b.push_back(v);
  return b;
}

}  // namespace

RpcMetrics::RpcMetrics(prometheus::Registry& registry)
    : family_(prometheus::BuildHistogram()
                  .Name("kvtier_cache_rpc_duration_seconds")
                  .Help("Time from an RPC's arrival to its final status, by method and status code")
                  .Register(registry)) {}

void RpcMetrics::Observe(const std::string& method, grpc::StatusCode code, absl::Duration elapsed) {
  family_.Add({{"method", method}, {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(code))}}, Buckets())
      .Observe(absl::ToDoubleSeconds(elapsed));
}

}  // namespace kvtier::cache
