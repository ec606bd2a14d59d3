// The one place a cache request is checked before any block moves: its
// namespace (well formed, served here), its layout, its block hashes, its
// layer range, its lease, and for a Put the fast path session whose staging
// region it names, and whether the caller's tenant may do it (its
// namespaces, its role). Every way of serving blocks (gRPC Get, Match, fast
// path leases, Put by bytes or by staged range) is an adapter that asks
// this first, so a check added here holds on every path.
// Thread-safe (const after construction).
#ifndef KVTIER_SERVICES_CACHE_SERVER_REQUEST_PLANNER_H_
#define KVTIER_SERVICES_CACHE_SERVER_REQUEST_PLANNER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/v1/cache.pb.h"
#include "services/cache/fast_path/fast_path_server.h"
#include "services/kvblock/block_key.h"
#include "services/kvblock/layout.h"
#include "services/rpc/tenants.h"

namespace kvtier::cache {

inline constexpr int kMaxBlocksPerRequest = 65536;

// What a request names: its namespace and layout, checked, and who asks.
struct RequestScope {
  std::shared_ptr<const Caller> caller;
  std::string ns;
  kvblock::LatentLayout layout;
  uint64_t layout_id = 0;
};

// Blocks of one scope, checked (Match, LeaseBlocks).
struct BlocksPlan {
  RequestScope scope;
  std::vector<kvblock::BlockHash> hashes;
  std::optional<absl::Duration> lease_ttl;  // set: pin what matches (0: the default)
};

// A GetRequest, checked: which blocks, which layers, the lease it ends.
struct GetPlan {
  RequestScope scope;
  std::vector<kvblock::BlockHash> hashes;
  uint32_t layer_begin = 0;
  uint32_t layer_count = 0;
  uint64_t lease_id = 0;  // 0: none
};

// A Put stream's header, checked: its scope, and the staging region its
// slices may name (null: inline slices only).
struct PutPlan {
  RequestScope scope;
  std::shared_ptr<const StagingRegion> staging;
};

class RequestPlanner {
 public:
  // `namespaces`: the tenants served; empty serves any well-formed name.
  // `fast_path` may be null (then requests naming a session fail
  // FAILED_PRECONDITION); not owned.
  RequestPlanner(std::vector<std::string> namespaces, FastPathServer* fast_path)
      : namespaces_(namespaces.begin(), namespaces.end()), fast_path_(fast_path) {}

  // INVALID_ARGUMENT for a malformed namespace or layout, PERMISSION_DENIED
  // for a namespace the caller's tenant may not use, NOT_FOUND for one this
  // server does not serve.
  absl::StatusOr<RequestScope> PlanScope(std::shared_ptr<const Caller> caller, const std::string& ns,
                                         const v1::LatentLayout& layout) const;
  // As PlanScope, and INVALID_ARGUMENT for bad hashes or too many.
  absl::StatusOr<BlocksPlan> PlanMatch(std::shared_ptr<const Caller> caller, const v1::MatchRequest& request) const;
  absl::StatusOr<BlocksPlan> PlanLease(std::shared_ptr<const Caller> caller,
                                       const v1::LeaseBlocksRequest& request) const;
  // As PlanMatch, and INVALID_ARGUMENT for a layer range outside the layout.
  absl::StatusOr<GetPlan> PlanGet(std::shared_ptr<const Caller> caller, const v1::GetRequest& request) const;
  // As PlanScope, and PERMISSION_DENIED for a reader; FAILED_PRECONDITION /
  // NOT_FOUND for a fast path session this server does not have or does
  // not know.
  absl::StatusOr<PutPlan> PlanPut(std::shared_ptr<const Caller> caller, const v1::PutHeader& header) const;
  // PlanPut's checks of the caller's rights alone (asked again of a Put
  // stream when the tenants file changes under it).
  absl::StatusOr<RequestScope> PlanPutScope(std::shared_ptr<const Caller> caller, const v1::PutHeader& header) const;

 private:
  absl::StatusOr<BlocksPlan> PlanBlocks(std::shared_ptr<const Caller> caller, const std::string& ns,
                                        const v1::LatentLayout& layout,
                                        const google::protobuf::RepeatedPtrField<std::string>& hashes) const;

  const absl::flat_hash_set<std::string> namespaces_;
  FastPathServer* const fast_path_;
};

absl::Status NoFastPath();

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_SERVER_REQUEST_PLANNER_H_
