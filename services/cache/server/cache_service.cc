#include "services/cache/server/cache_service.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
#include "services/cache/server/get_reactor.h"
#include "services/cache/server/put_reactor.h"
#include "services/cache/server/reactor_support.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/layout.h"
#include "services/rpc/caller.h"
#include "services/rpc/grpc_status.h"

namespace kvtier::cache {
namespace {

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, RpcTimer timer,
                                      const absl::Status& status) {
  const grpc::Status g = ToGrpcStatus(status);
  timer.Done(g.error_code());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(g);
  return reactor;
}

}  // namespace

void FillStats(const StoreStats& s, const FastPathCounters& f, v1::StatsResponse& r) {
  for (const TierCounters& t : s.tiers) {
    v1::TierStats* ts = r.add_tiers();
    ts->set_tier(static_cast<v1::Tier>(t.tier));
    ts->set_capacity_bytes(t.capacity_bytes);
    ts->set_used_bytes(t.used_bytes);
    ts->set_blocks(t.blocks);
    ts->set_hits(t.hits);
    ts->set_promotions(t.promotions);
    ts->set_demotions(t.demotions);
    ts->set_evictions(t.evictions);
    ts->set_write_errors(t.write_errors);
    ts->set_segment_slack_bytes(t.segment_slack_bytes);
  }
  r.set_metadata_bytes(s.metadata_bytes);
  r.set_misses(s.misses);
  r.set_blocks_stored(s.blocks_stored);
  r.set_blocks_stored_cold_start(s.blocks_stored_cold_start);
  r.set_blocks_deduplicated(s.blocks_deduplicated);
  r.set_bytes_in(s.bytes_in);
  r.set_bytes_out(s.bytes_out);
  r.set_checksum_failures(s.checksum_failures);
  r.set_arrival_checksum_failures(s.arrival_checksum_failures);
  r.set_active_leases(s.active_leases);
  r.set_pending_blocks(s.pending_blocks);
  r.set_pinned_blocks(s.pinned_blocks);
  r.set_fast_path_sessions(f.sessions);
  r.set_fast_path_blocks_out(f.blocks_out);
  r.set_fast_path_bytes_out(f.bytes_out);
  r.set_fast_path_bytes_in(f.bytes_in);
  r.set_fast_path_staging_bytes(f.staging_bytes);
  r.set_fast_path_device_staging_bytes(f.device_staging_bytes);
  r.set_server_version(kCacheServerVersion);
  r.add_block_format_versions(kvblock::kBlockFormatVersion);
  r.add_block_format_versions(kvblock::kIndexedBlockFormatVersion);
}

void FillTenantStats(const StoreStats& s, const Caller& caller, v1::StatsResponse& r) {
  const auto used = s.used_by_owner.find(caller.tenant);
  const uint64_t quotas[] = {caller.quota.device_bytes(), caller.quota.host_bytes(), caller.quota.disk_bytes()};
  for (size_t i = 0; i < s.tiers.size(); ++i) {
    v1::TierStats* ts = r.add_tiers();
    ts->set_tier(static_cast<v1::Tier>(s.tiers[i].tier));
    ts->set_capacity_bytes(i < 3 && quotas[i] > 0 ? quotas[i] : s.tiers[i].capacity_bytes);
    if (used != s.used_by_owner.end()) ts->set_used_bytes(used->second[i]);
  }
  r.set_server_version(kCacheServerVersion);
  r.add_block_format_versions(kvblock::kBlockFormatVersion);
  r.add_block_format_versions(kvblock::kIndexedBlockFormatVersion);
}

OwnerQuota ToOwnerQuota(const v1::TenantQuota& quota) {
  return {{quota.device_bytes(), quota.host_bytes(), quota.disk_bytes()}, quota.put_bytes_in_flight()};
}

std::vector<std::string> OvercommittedQuotas(std::span<const std::pair<std::string, OwnerQuota>> quotas,
                                             std::span<const TierCounters> tiers) {
  std::vector<std::string> warnings;
  for (size_t i = 0; i < tiers.size() && i < 3; ++i) {
    uint64_t sum = 0;
    for (const auto& [tenant, quota] : quotas) sum += quota.tier_bytes[i];
    if (sum <= tiers[i].capacity_bytes) continue;
    warnings.push_back(absl::StrCat("the tenants' quotas in the ",
                                    kvblock::TierName(static_cast<v1::Tier>(tiers[i].tier)), " tier add up to ", sum,
                                    " bytes, more than the ", tiers[i].capacity_bytes,
                                    " it holds: a tenant within its quota may lose blocks to another's Puts"));
  }
  return warnings;
}

CacheService::CacheService(BlockStore* store, Executor* executor, RpcMetrics* metrics,
                           std::vector<std::string> namespaces, FastPathServer* fast_path, TenantRegistry* tenants,
                           IdleStreams* idle_puts)
    : store_(store),
      executor_(executor),
      metrics_(metrics),
      fast_path_(fast_path),
      tenants_(tenants),
      idle_puts_(idle_puts),
      planner_(std::move(namespaces), fast_path) {}

absl::StatusOr<std::shared_ptr<const Caller>> CacheService::CallerOf(const grpc::CallbackServerContext& context) const {
  absl::StatusOr<std::shared_ptr<const Caller>> caller = kvtier::CallerOf(context);
  if (!caller.ok()) (void)Count("", caller.status());
  return caller;
}

absl::Status CacheService::Count(const std::string& tenant, absl::Status status) const {
  if (metrics_ != nullptr && !status.ok()) metrics_->CountDenied(tenant, status);
  return status;
}

GetAnswer CacheService::ReadForGet(const GetPlan& plan, size_t index) const {
  GetAnswer answer;
  absl::StatusOr<std::shared_ptr<const PinnedBlock>> block =
      store_->Read(plan.scope.ns, plan.scope.layout_id, plan.hashes[index]);
  if (!block.ok()) {
    answer.miss = block.status();
    return answer;
  }
  answer.tier = static_cast<v1::Tier>((*block)->tier());
  if (plan.layer_count == plan.scope.layout.num_layers) {
    answer.record = *std::move(block);
    return answer;
  }
  // Only the layers asked for: a record of its own, with its own CRC. The
  // store checked this one's as it read it.
  const std::string record = (*block)->CopyToString();
  absl::StatusOr<kvblock::BlockView> view =
      kvblock::ParseBlock(record, &plan.scope.layout, kvblock::CrcCheck::kCheckedBefore);
  if (!view.ok()) {
    answer.miss = view.status();
    return answer;
  }
  const size_t per_layer = view->header.layer_payload_bytes;
  absl::StatusOr<std::string> subset = kvblock::SerializeBlock(
      kvblock::HeaderFor(plan.scope.layout, plan.layer_begin, plan.layer_count),
      view->payloads.substr(size_t{plan.layer_begin} * per_layer, size_t{plan.layer_count} * per_layer));
  if (subset.ok()) {
    answer.subset = *std::move(subset);
  } else {
    answer.miss = subset.status();
  }
  return answer;
}

grpc::ServerUnaryReactor* CacheService::Match(grpc::CallbackServerContext* context, const v1::MatchRequest* request,
                                              v1::MatchResponse* response) {
  RpcTimer timer(metrics_, "Match");
  absl::StatusOr<std::shared_ptr<const Caller>> caller = CallerOf(*context);
  if (!caller.ok()) return FinishUnary(context, std::move(timer), caller.status());
  const std::string tenant = (*caller)->tenant;
  absl::StatusOr<BlocksPlan> plan = planner_.PlanMatch(*std::move(caller), *request);
  if (!plan.ok()) return FinishUnary(context, std::move(timer), Count(tenant, plan.status()));
  // A DeepSeek-V4 prefix can only be restored where a restore point is.
  MatchResult m = store_->Match(plan->scope.ns, plan->scope.layout_id, plan->hashes, plan->lease_ttl, tenant,
                                plan->scope.caller->quota.max_leases(), plan->scope.layout.IsV4());
  if (!m.lease_status.ok()) return FinishUnary(context, std::move(timer), Count(tenant, m.lease_status));
  if (metrics_ != nullptr) metrics_->CountMatch(tenant, m.matched_blocks, plan->hashes.size());
  response->set_matched_blocks(m.matched_blocks);
  response->set_stored_blocks(m.stored_blocks);
  for (uint32_t i : m.restore_points) response->add_restore_points(i);
  for (TierKind t : m.tiers) response->add_tiers(static_cast<v1::Tier>(t));
  if (m.lease_id != 0) {
    response->set_lease_id(m.lease_id);
    response->set_lease_deadline_unix_ms(absl::ToUnixMillis(m.lease_deadline));
  }
  return FinishUnary(context, std::move(timer), absl::OkStatus());
}

grpc::ServerReadReactor<grpc::ByteBuffer>* CacheService::Put(grpc::CallbackServerContext* context,
                                                             grpc::ByteBuffer* response) {
  return NewPutReactor(this, context, CallerOf(*context), response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CacheService::Get(grpc::CallbackServerContext* context,
                                                              const grpc::ByteBuffer* request) {
  return NewGetReactor(this, context, CallerOf(*context), request);
}

grpc::ServerUnaryReactor* CacheService::ReleaseLease(grpc::CallbackServerContext* context,
                                                     const v1::ReleaseLeaseRequest* request,
                                                     v1::ReleaseLeaseResponse*) {
  RpcTimer timer(metrics_, "ReleaseLease");
  absl::StatusOr<std::shared_ptr<const Caller>> caller = CallerOf(*context);
  if (!caller.ok()) return FinishUnary(context, std::move(timer), caller.status());
  const uint64_t id = request->lease_id();
  absl::Status status = fast_path_ != nullptr && (id & kFastPathLeaseBit) != 0
                            ? fast_path_->Release(id, (*caller)->SessionOwner())
                            : store_->ReleaseLease(id, (*caller)->tenant);
  return FinishUnary(context, std::move(timer), status);
}

grpc::ServerUnaryReactor* CacheService::Stats(grpc::CallbackServerContext* context, const v1::StatsRequest*,
                                              v1::StatsResponse* response) {
  RpcTimer timer(metrics_, "Stats");
  absl::StatusOr<std::shared_ptr<const Caller>> caller = CallerOf(*context);
  if (!caller.ok()) return FinishUnary(context, std::move(timer), caller.status());
  const StoreStats stats = store_->Stats();
  if ((*caller)->role != v1::ADMIN && tenants_ != nullptr) {
    FillTenantStats(stats, **caller, *response);
    return FinishUnary(context, std::move(timer), absl::OkStatus());
  }
  FillStats(stats, fast_path_ != nullptr ? fast_path_->Counters() : FastPathCounters(), *response);
  return FinishUnary(context, std::move(timer), absl::OkStatus());
}

grpc::ServerUnaryReactor* CacheService::OpenFastPath(grpc::CallbackServerContext* context,
                                                     const v1::OpenFastPathRequest* request,
                                                     v1::OpenFastPathResponse* response) {
  RpcTimer timer(metrics_, "OpenFastPath");
  if (fast_path_ == nullptr) return FinishUnary(context, std::move(timer), NoFastPath());
  absl::StatusOr<std::shared_ptr<const Caller>> caller = CallerOf(*context);
  if (!caller.ok()) return FinishUnary(context, std::move(timer), caller.status());
  absl::StatusOr<v1::OpenFastPathResponse> opened =
      fast_path_->Open(*request, **caller, PeerCertificateChain(*context));
  if (!opened.ok()) return FinishUnary(context, std::move(timer), Count((*caller)->tenant, opened.status()));
  *response = *std::move(opened);
  return FinishUnary(context, std::move(timer), absl::OkStatus());
}

grpc::ServerUnaryReactor* CacheService::LeaseBlocks(grpc::CallbackServerContext* context,
                                                    const v1::LeaseBlocksRequest* request,
                                                    v1::LeaseBlocksResponse* response) {
  RpcTimer timer(metrics_, "LeaseBlocks");
  absl::StatusOr<std::shared_ptr<const Caller>> caller = CallerOf(*context);
  if (!caller.ok()) return FinishUnary(context, std::move(timer), caller.status());
  const std::string tenant = (*caller)->tenant;
  absl::StatusOr<BlocksPlan> plan = planner_.PlanLease(*std::move(caller), *request);
  if (!plan.ok()) return FinishUnary(context, std::move(timer), Count(tenant, plan.status()));
  // Pinning may promote blocks (a copy between tiers): not on a gRPC thread.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto work = [this, reactor, request, response, plan = *std::move(plan), timer]() mutable {
    const absl::Status status = fast_path_->Lease(request->session_id(), plan.scope.ns, plan.scope.layout_id,
                                                  plan.hashes, *plan.lease_ttl, *response, *plan.scope.caller);
    const grpc::Status g = ToGrpcStatus(status);
    timer.Done(g.error_code());
    reactor->Finish(g);
  };
  if (!executor_->TrySubmit(std::move(work))) {
    timer.Done(kBusy.error_code());
    reactor->Finish(kBusy);
  }
  return reactor;
}

}  // namespace kvtier::cache
