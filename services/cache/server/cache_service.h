// kvtier.v1.KvCache over a BlockStore, on gRPC's callback API. Reactions only
// validate and hand work to the executor; Get writes one block at a time
// (the next is read only when the previous one has been sent), straight from
// the store's pages. Thread-safe.
#ifndef KVTIER_SERVICES_CACHE_SERVER_CACHE_SERVICE_H_
#define KVTIER_SERVICES_CACHE_SERVER_CACHE_SERVICE_H_

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/v1/cache.grpc.pb.h"
#include "services/base/executor.h"
#include "services/base/version.h"
#include "services/cache/fast_path/fast_path_server.h"
#include "services/cache/server/idle_streams.h"
#include "services/cache/server/request_planner.h"
#include "services/cache/server/rpc_metrics.h"
#include "services/cache/store/block_store.h"

namespace kvtier::cache {

inline const std::string kCacheServerVersion = VersionOf("kvtier-cache");
inline constexpr int kMaxSlicesPerBatch = 4096;

// Get is registered raw (ByteBuffer in and out) so its answers can point
// into the store, and Put so that a message that does not parse is refused
// instead of ending the stream; every other method is typed.
using KvCacheBase = v1::KvCache::WithCallbackMethod_Match<v1::KvCache::WithRawCallbackMethod_Put<
    v1::KvCache::WithRawCallbackMethod_Get<v1::KvCache::WithCallbackMethod_ReleaseLease<
        v1::KvCache::WithCallbackMethod_Stats<v1::KvCache::WithCallbackMethod_OpenFastPath<
            v1::KvCache::WithCallbackMethod_LeaseBlocks<v1::KvCache::Service>>>>>>>;

// One block of a Get: the whole pinned record, or the layers asked for, or
// why neither (a miss).
struct GetAnswer {
  std::shared_ptr<const PinnedBlock> record;  // when all layers were asked for
  std::string subset;                         // else the layers, as a record
  v1::Tier tier = v1::TIER_UNSPECIFIED;
  absl::Status miss;
};

class CacheService final : public KvCacheBase {
 public:
  // None owned; all must outlive the service. `metrics` may be null, and
  // `fast_path` (then OpenFastPath answers FAILED_PRECONDITION).
  // `namespaces`: the tenants served; empty serves any well-formed name.
  // `tenants`: who may call (null: every caller, one trust domain).
  // `idle_puts`: ends Put streams that wait on their client too long (null:
  // never).
  CacheService(BlockStore* store, Executor* executor, RpcMetrics* metrics, std::vector<std::string> namespaces = {},
               FastPathServer* fast_path = nullptr, TenantRegistry* tenants = nullptr,
               IdleStreams* idle_puts = nullptr);

  // Who a call is from (services/rpc/caller.h), a refusal counted.
  absl::StatusOr<std::shared_ptr<const Caller>> CallerOf(const grpc::CallbackServerContext& context) const;
  // Counts `status` against `tenant` when it is a refusal; returns it.
  absl::Status Count(const std::string& tenant, absl::Status status) const;

  // Every request is checked here first (request_planner.h).
  const RequestPlanner& planner() const { return planner_; }
  // Reads block `index` of `plan` (its CRC32C verified by the store).
  GetAnswer ReadForGet(const GetPlan& plan, size_t index) const;

  grpc::ServerUnaryReactor* Match(grpc::CallbackServerContext* context, const v1::MatchRequest* request,
                                  v1::MatchResponse* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* Put(grpc::CallbackServerContext* context,
                                                 grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Get(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ReleaseLease(grpc::CallbackServerContext* context, const v1::ReleaseLeaseRequest* request,
                                         v1::ReleaseLeaseResponse* response) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context, const v1::StatsRequest* request,
                                  v1::StatsResponse* response) override;
  grpc::ServerUnaryReactor* OpenFastPath(grpc::CallbackServerContext* context, const v1::OpenFastPathRequest* request,
                                         v1::OpenFastPathResponse* response) override;
  grpc::ServerUnaryReactor* LeaseBlocks(grpc::CallbackServerContext* context, const v1::LeaseBlocksRequest* request,
                                        v1::LeaseBlocksResponse* response) override;

  BlockStore* store() const { return store_; }
  Executor* executor() const { return executor_; }
  RpcMetrics* metrics() const { return metrics_; }
  FastPathServer* fast_path() const { return fast_path_; }
  IdleStreams* idle_puts() const { return idle_puts_; }

 private:
  BlockStore* store_;
  Executor* executor_;
  RpcMetrics* metrics_;
  FastPathServer* fast_path_;
  TenantRegistry* tenants_;
  IdleStreams* idle_puts_;
  RequestPlanner planner_;
};

// Fills a StatsResponse from the store's (and the fast path's) counters.
void FillStats(const StoreStats& stats, const FastPathCounters& fast_path, v1::StatsResponse& response);
// A tenant's own figures (see cache.proto, Stats).
void FillTenantStats(const StoreStats& stats, const Caller& caller, v1::StatsResponse& response);
// What the store holds a tenant to, from its quota in the tenants file.
OwnerQuota ToOwnerQuota(const v1::TenantQuota& quota);
// A warning for each of `tiers` whose tenants' `quotas` add up to more than
// it holds: a tenant within its quota may then lose blocks to another's
// Puts.
std::vector<std::string> OvercommittedQuotas(std::span<const std::pair<std::string, OwnerQuota>> quotas,
                                             std::span<const TierCounters> tiers);

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_SERVER_CACHE_SERVICE_H_
