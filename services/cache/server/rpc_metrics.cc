#include "services/cache/server/rpc_metrics.h"

#include "absl/status/status.h"
#include "services/base/status.h"
#include "services/rpc/grpc_status.h"

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
                  .Register(registry)),
      hits_(prometheus::BuildCounter()
                .Name("kvtier_cache_tenant_hits_total")
                .Help("Blocks a tenant's Match and Get found")
                .Register(registry)),
      misses_(prometheus::BuildCounter()
                  .Name("kvtier_cache_tenant_misses_total")
                  .Help("Blocks a tenant's Match and Get asked for and did not find")
                  .Register(registry)),
      denied_(prometheus::BuildCounter()
                  .Name("kvtier_cache_tenant_denied_total")
                  .Help("Requests refused, by tenant (empty: not authenticated) and reason")
                  .Register(registry)),
      match_blocks_(prometheus::BuildCounter()
                        .Name("kvtier_cache_match_blocks_total")
                        .Help("Blocks Match was asked about: found (a prompt prefix reused) or not (recomputed)")
                        .Register(registry)),
      match_hits_(match_blocks_.Add({{"result", "hit"}})),
      match_misses_(match_blocks_.Add({{"result", "miss"}})) {}

void RpcMetrics::CountBlocks(const std::string& tenant, uint64_t hits, uint64_t misses) {
  if (hits > 0) hits_.Add({{"tenant", tenant}}).Increment(static_cast<double>(hits));
  if (misses > 0) misses_.Add({{"tenant", tenant}}).Increment(static_cast<double>(misses));
}

void RpcMetrics::CountMatch(const std::string& tenant, uint64_t matched, uint64_t asked) {
  CountBlocks(tenant, matched, asked - matched);
  match_hits_.Increment(static_cast<double>(matched));
  match_misses_.Increment(static_cast<double>(asked - matched));
}

void RpcMetrics::CountDenied(const std::string& tenant, const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kResourceExhausted:
      denied_.Add({{"tenant", tenant}, {"reason", absl::StatusCodeToString(status.code())}}).Increment();
      return;
    default:
      return;
  }
}

void RpcMetrics::Observe(const std::string& method, grpc::StatusCode code, absl::Duration elapsed) {
  family_.Add({{"method", method}, {"code", StatusCodeName(code)}}, Buckets()).Observe(absl::ToDoubleSeconds(elapsed));
}

}  // namespace kvtier::cache
