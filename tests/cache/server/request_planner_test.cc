// RequestPlanner: every kind of request is refused, with the right code,
// for each thing it checks, and planned as asked when all is well.
#include "services/cache/server/request_planner.h"

#include <gtest/gtest.h>

#include <functional>

#include "services/kvblock/layout.h"
#include "tests/v4_records.h"

namespace kvtier::cache {
namespace {

kvblock::LatentLayout Layout() {
  kvblock::LatentLayout l;
  l.model_id = "planner-test";
  l.num_layers = 4;
  l.kv_lora_rank = 16;
  l.rope_dim = 8;
  l.tokens_per_block = 16;
  l.codec = kernels::Codec::kInt8;
  return l;
}

// DeepSeek-V4's (block format 3).
v1::LatentLayout V4Layout() { return kvblock::LayoutToProto(testing::SmallV4Layout()); }

std::string AHash(char c) { return std::string(32, c); }

// A caller of one trust domain (no tenants file): may do anything.
const std::shared_ptr<const Caller> kAnyone = std::make_shared<const Caller>();

std::shared_ptr<const Caller> TenantCaller(v1::TenantRole role, std::vector<std::string> namespaces) {
  auto caller = std::make_shared<Caller>();
  caller->tenant = "acme";
  caller->role = role;
  caller->namespaces.insert(namespaces.begin(), namespaces.end());
  return caller;
}

// The same checks through every plan that names a scope and hashes.
struct Kind {
  const char* name;
  std::function<absl::Status(const RequestPlanner&, std::shared_ptr<const Caller>, const std::string& ns,
                             const v1::LatentLayout&, const std::vector<std::string>& hashes)>
      plan;
};

// A request of type R naming a scope and hashes.
template <typename R>
R Named(const std::string& ns, const v1::LatentLayout& layout, const std::vector<std::string>& hashes) {
  R r;
  r.set_kv_namespace(ns);
  *r.mutable_layout() = layout;
  for (const std::string& h : hashes) r.add_block_hashes(h);
  return r;
}

std::vector<Kind> Kinds() {
  return {
      {"Match", [](const RequestPlanner& p, std::shared_ptr<const Caller> c,
                   const auto&... a) { return p.PlanMatch(std::move(c), Named<v1::MatchRequest>(a...)).status(); }},
      {"Get", [](const RequestPlanner& p, std::shared_ptr<const Caller> c,
                 const auto&... a) { return p.PlanGet(std::move(c), Named<v1::GetRequest>(a...)).status(); }},
      {"LeaseBlocks (the planner has no fast path)",
       [](const RequestPlanner& p, std::shared_ptr<const Caller> c, const auto&... a) {
         absl::Status s = p.PlanLease(std::move(c), Named<v1::LeaseBlocksRequest>(a...)).status();
         // Refused after the scope's checks: what they pass reads as "no fast path".
         return s.code() == absl::StatusCode::kFailedPrecondition ? absl::OkStatus() : s;
       }},
  };
}

TEST(RequestPlanner, EveryPlanRefusesWhatItChecks) {
  const RequestPlanner planner({"tenant-a"}, /*fast_path=*/nullptr);
  const v1::LatentLayout good = kvblock::LayoutToProto(Layout());
  v1::LatentLayout bad = good;
  bad.set_num_layers(0);
  for (const Kind& kind : Kinds()) {
    SCOPED_TRACE(kind.name);
    EXPECT_TRUE(kind.plan(planner, kAnyone, "tenant-a", good, {AHash('a'), AHash('b')}).ok());
    EXPECT_EQ(kind.plan(planner, kAnyone, "tenant-b", good, {}).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(kind.plan(planner, kAnyone, "", good, {}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(kind.plan(planner, kAnyone, "a/b", good, {}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(kind.plan(planner, kAnyone, "tenant-a", bad, {}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(kind.plan(planner, kAnyone, "tenant-a", good, {"short"}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(
        kind.plan(planner, kAnyone, "tenant-a", good, std::vector<std::string>(kMaxBlocksPerRequest + 1, AHash('a')))
            .code(),
        absl::StatusCode::kInvalidArgument);
  }
  // Put and fast path leases: the same scope checks, and no session here.
  v1::PutHeader header;
  header.set_kv_namespace("tenant-b");
  *header.mutable_layout() = good;
  EXPECT_EQ(planner.PlanPut(kAnyone, header).status().code(), absl::StatusCode::kNotFound);
  header.set_kv_namespace("tenant-a");
  EXPECT_TRUE(planner.PlanPut(kAnyone, header).ok());
  // DeepSeek-V4's records hold every layer: a Get of some is refused.
  v1::PutHeader v4 = header;
  *v4.mutable_layout() = V4Layout();
  EXPECT_TRUE(planner.PlanPut(kAnyone, v4).ok());
  v1::GetRequest get = Named<v1::GetRequest>("tenant-a", V4Layout(), {AHash('a')});
  EXPECT_TRUE(planner.PlanGet(kAnyone, get).ok());
  get.set_layer_count(1);
  const absl::Status refused = planner.PlanGet(kAnyone, get).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("DeepSeek-V4"), std::string::npos) << refused;
  header.set_fast_path_session_id(7);
  EXPECT_EQ(planner.PlanPut(kAnyone, header).status().code(), absl::StatusCode::kFailedPrecondition);
  v1::LeaseBlocksRequest lease;
  lease.set_kv_namespace("tenant-a");
  *lease.mutable_layout() = good;
  EXPECT_EQ(planner.PlanLease(kAnyone, lease).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A tenant's caller names only its own namespaces, whatever the server
// serves, on every kind of request; a reader may not Put.
TEST(RequestPlanner, ATenantIsHeldToItsNamespacesAndRole) {
  const RequestPlanner planner({}, /*fast_path=*/nullptr);  // serves any namespace
  const v1::LatentLayout good = kvblock::LayoutToProto(Layout());
  for (v1::TenantRole role : {v1::READER, v1::WRITER, v1::SERVICE}) {
    SCOPED_TRACE(v1::TenantRole_Name(role));
    const auto caller = TenantCaller(role, {"acme", "acme-dev"});
    for (const Kind& kind : Kinds()) {
      SCOPED_TRACE(kind.name);
      EXPECT_TRUE(kind.plan(planner, caller, "acme-dev", good, {AHash('a')}).ok());
      EXPECT_EQ(kind.plan(planner, caller, "globex", good, {AHash('a')}).code(), absl::StatusCode::kPermissionDenied);
    }
    v1::PutHeader header;
    *header.mutable_layout() = good;
    header.set_kv_namespace("globex");
    EXPECT_EQ(planner.PlanPut(caller, header).status().code(), absl::StatusCode::kPermissionDenied);
    header.set_kv_namespace("acme");
    EXPECT_EQ(planner.PlanPut(caller, header).status().code(),
              role == v1::READER ? absl::StatusCode::kPermissionDenied : absl::StatusCode::kOk);
  }
  // An admin names any namespace.
  for (const Kind& kind : Kinds()) {
    EXPECT_TRUE(kind.plan(planner, TenantCaller(v1::ADMIN, {}), "globex", good, {AHash('a')}).ok()) << kind.name;
  }
}

TEST(RequestPlanner, PlansWhatWasAskedFor) {
  const RequestPlanner planner({}, /*fast_path=*/nullptr);  // any namespace
  v1::GetRequest get;
  get.set_kv_namespace("anyone");
  *get.mutable_layout() = kvblock::LayoutToProto(Layout());
  get.add_block_hashes(AHash('x'));
  get.set_layer_begin(1);
  get.set_lease_id(42);
  absl::StatusOr<GetPlan> plan = planner.PlanGet(kAnyone, get);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->scope.ns, "anyone");
  EXPECT_EQ(plan->scope.layout_id, kvblock::LayoutId(Layout()));
  EXPECT_EQ(plan->layer_begin, 1u);
  EXPECT_EQ(plan->layer_count, 3u) << "0 means the rest of the layers";
  EXPECT_EQ(plan->lease_id, 42u);
  ASSERT_EQ(plan->hashes.size(), 1u);
  EXPECT_EQ(plan->hashes[0][0], 'x');
  get.set_layer_count(4);  // 1 + 4 > 4 layers
  EXPECT_EQ(planner.PlanGet(kAnyone, get).status().code(), absl::StatusCode::kInvalidArgument);

  v1::MatchRequest match;
  match.set_kv_namespace("anyone");
  *match.mutable_layout() = kvblock::LayoutToProto(Layout());
  EXPECT_FALSE(planner.PlanMatch(kAnyone, match)->lease_ttl.has_value());
  match.set_acquire_lease(true);
  match.set_lease_ttl_ms(1500);
  EXPECT_EQ(*planner.PlanMatch(kAnyone, match)->lease_ttl, absl::Milliseconds(1500));
}

}  // namespace
}  // namespace kvtier::cache
