#include "services/cache/server/request_planner.h"

#include "absl/strings/str_cat.h"
#include "services/common/status.h"

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

absl::StatusOr<RequestScope> RequestPlanner::PlanScope(const std::string& ns, const v1::LatentLayout& layout) const {
  KVTIER_RETURN_IF_ERROR(kvblock::ValidateNamespace(ns));
  if (!namespaces_.empty() && !namespaces_.contains(ns)) {
    return absl::NotFoundError(absl::StrCat("unknown namespace '", ns, "'"));
  }
  RequestScope scope;
  scope.ns = ns;
  KVTIER_ASSIGN_OR_RETURN(scope.layout, kvblock::LayoutFromProto(layout));
  scope.layout_id = kvblock::LayoutId(scope.layout);
  return scope;
}

absl::StatusOr<BlocksPlan> RequestPlanner::PlanBlocks(
    const std::string& ns, const v1::LatentLayout& layout,
    const google::protobuf::RepeatedPtrField<std::string>& hashes) const {
  BlocksPlan plan;
  KVTIER_ASSIGN_OR_RETURN(plan.scope, PlanScope(ns, layout));
  KVTIER_ASSIGN_OR_RETURN(plan.hashes, PlanHashes(hashes));
  return plan;
}

absl::StatusOr<BlocksPlan> RequestPlanner::PlanMatch(const v1::MatchRequest& request) const {
  KVTIER_ASSIGN_OR_RETURN(BlocksPlan plan,
                          PlanBlocks(request.kv_namespace(), request.layout(), request.block_hashes()));
  if (request.acquire_lease()) plan.lease_ttl = absl::Milliseconds(request.lease_ttl_ms());
  return plan;
}

absl::StatusOr<BlocksPlan> RequestPlanner::PlanLease(const v1::LeaseBlocksRequest& request) const {
  if (fast_path_ == nullptr) return NoFastPath();
  KVTIER_ASSIGN_OR_RETURN(BlocksPlan plan,
                          PlanBlocks(request.kv_namespace(), request.layout(), request.block_hashes()));
  plan.lease_ttl = absl::Milliseconds(request.lease_ttl_ms());
  return plan;
}

absl::StatusOr<GetPlan> RequestPlanner::PlanGet(const v1::GetRequest& request) const {
  GetPlan plan;
  KVTIER_ASSIGN_OR_RETURN(plan.scope, PlanScope(request.kv_namespace(), request.layout()));
  KVTIER_ASSIGN_OR_RETURN(plan.hashes, PlanHashes(request.block_hashes()));
  const uint32_t layers = plan.scope.layout.num_layers;
  plan.layer_begin = request.layer_begin();
  plan.layer_count = request.layer_count() == 0 ? layers - std::min(plan.layer_begin, layers) : request.layer_count();
  if (plan.layer_begin >= layers || plan.layer_count > layers - plan.layer_begin) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", plan.layer_begin, ", +", request.layer_count(),
                                                   ") outside the ", layers, " of the layout"));
  }
  plan.lease_id = request.lease_id();
  return plan;
}

absl::StatusOr<PutPlan> RequestPlanner::PlanPut(const v1::PutHeader& header) const {
  PutPlan plan;
  KVTIER_ASSIGN_OR_RETURN(plan.scope, PlanScope(header.kv_namespace(), header.layout()));
  if (const uint64_t id = header.fast_path_session_id(); id != 0) {
    if (fast_path_ == nullptr) return NoFastPath();
    KVTIER_ASSIGN_OR_RETURN(plan.staging, fast_path_->Staging(id));
  }
  return plan;
}

}  // namespace kvtier::cache
