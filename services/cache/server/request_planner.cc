#include "services/cache/server/request_planner.h"

#include "absl/strings/str_cat.h"
#include "services/base/status.h"

namespace kvtier::cache {
namespace {

absl::StatusOr<std::vector<kvblock::BlockHash>> PlanHashes(
    const google::protobuf::RepeatedPtrField<std::string>& hashes) {
  if (hashes.size() > kMaxBlocksPerRequest) {
    return absl::InvalidArgumentError(
        absl::StrCat(hashes.size(), " block hashes, at most ", kMaxBlocksPerRequest, " per request"));
  }
  std::vector<kvblock::BlockHash> out;
  out.reserve(hashes.size());
  for (int i = 0; i < hashes.size(); ++i) {
    absl::StatusOr<kvblock::BlockHash> h = kvblock::HashFromBytes(hashes[i]);
    if (!h.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("block_hashes[", i, "]: ", h.status().message()));
    }
    out.push_back(*h);
  }
  return out;
}

}  // namespace

absl::Status NoFastPath() { return absl::FailedPreconditionError("this cache runs without a fast path"); }

absl::StatusOr<RequestScope> RequestPlanner::PlanScope(std::shared_ptr<const Caller> caller, const std::string& ns,
                                                       const v1::LatentLayout& layout) const {
  KVTIER_RETURN_IF_ERROR(kvblock::ValidateNamespace(ns));
  KVTIER_RETURN_IF_ERROR(CheckNamespace(*caller, ns));
  if (!namespaces_.empty() && !namespaces_.contains(ns)) {
    return absl::NotFoundError(absl::StrCat("unknown namespace '", ns, "'"));
  }
  RequestScope scope;
  scope.caller = std::move(caller);
  scope.ns = ns;
  KVTIER_ASSIGN_OR_RETURN(scope.layout, kvblock::LayoutFromProto(layout));
  scope.layout_id = kvblock::LayoutId(scope.layout);
  return scope;
}

absl::StatusOr<BlocksPlan> RequestPlanner::PlanBlocks(
    std::shared_ptr<const Caller> caller, const std::string& ns, const v1::LatentLayout& layout,
    const google::protobuf::RepeatedPtrField<std::string>& hashes) const {
  BlocksPlan plan;
  KVTIER_ASSIGN_OR_RETURN(plan.scope, PlanScope(std::move(caller), ns, layout));
  KVTIER_ASSIGN_OR_RETURN(plan.hashes, PlanHashes(hashes));
  return plan;
}

absl::StatusOr<BlocksPlan> RequestPlanner::PlanMatch(std::shared_ptr<const Caller> caller,
                                                     const v1::MatchRequest& request) const {
  KVTIER_ASSIGN_OR_RETURN(
      BlocksPlan plan, PlanBlocks(std::move(caller), request.kv_namespace(), request.layout(), request.block_hashes()));
  if (request.acquire_lease()) plan.lease_ttl = absl::Milliseconds(request.lease_ttl_ms());
  return plan;
}

absl::StatusOr<BlocksPlan> RequestPlanner::PlanLease(std::shared_ptr<const Caller> caller,
                                                     const v1::LeaseBlocksRequest& request) const {
  KVTIER_ASSIGN_OR_RETURN(
      BlocksPlan plan, PlanBlocks(std::move(caller), request.kv_namespace(), request.layout(), request.block_hashes()));
  if (fast_path_ == nullptr) return NoFastPath();
  plan.lease_ttl = absl::Milliseconds(request.lease_ttl_ms());
  return plan;
}

absl::StatusOr<GetPlan> RequestPlanner::PlanGet(std::shared_ptr<const Caller> caller,
                                                const v1::GetRequest& request) const {
  GetPlan plan;
  KVTIER_ASSIGN_OR_RETURN(plan.scope, PlanScope(std::move(caller), request.kv_namespace(), request.layout()));
  KVTIER_ASSIGN_OR_RETURN(plan.hashes, PlanHashes(request.block_hashes()));
  const uint32_t layers = plan.scope.layout.num_layers;
  plan.layer_begin = request.layer_begin();
  plan.layer_count = request.layer_count() == 0 ? layers - std::min(plan.layer_begin, layers) : request.layer_count();
  if (plan.layer_begin >= layers || plan.layer_count > layers - plan.layer_begin) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", plan.layer_begin, ", +", request.layer_count(),
                                                   ") outside the ", layers, " of the layout"));
  }
  if (plan.scope.layout.IsV4() && plan.layer_count != layers) {
    return absl::InvalidArgumentError("a DeepSeek-V4 record holds every layer: Get takes no layer range for it");
  }
  plan.lease_id = request.lease_id();
  return plan;
}

absl::StatusOr<RequestScope> RequestPlanner::PlanPutScope(std::shared_ptr<const Caller> caller,
                                                          const v1::PutHeader& header) const {
  if (!caller->MayWrite()) {
    return absl::PermissionDeniedError(absl::StrCat(caller->Describe(), " is a reader: it may not Put"));
  }
  return PlanScope(std::move(caller), header.kv_namespace(), header.layout());
}

absl::StatusOr<PutPlan> RequestPlanner::PlanPut(std::shared_ptr<const Caller> caller,
                                                const v1::PutHeader& header) const {
  PutPlan plan;
  KVTIER_ASSIGN_OR_RETURN(plan.scope, PlanPutScope(std::move(caller), header));
  if (const uint64_t id = header.fast_path_session_id(); id != 0) {
    if (fast_path_ == nullptr) return NoFastPath();
    KVTIER_ASSIGN_OR_RETURN(plan.staging, fast_path_->Staging(id, plan.scope.caller->SessionOwner()));
  }
  return plan;
}

}  // namespace kvtier::cache
