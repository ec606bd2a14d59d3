// RequestPlanner, the one check of every cache request from any client
// before a block moves: what it accepts names a namespace the server
// serves and the caller may use, a valid layout (its id computed), whole
// 32-byte hashes within the limit, layers inside the layout (every layer
// for DeepSeek-V4), a Put only from a caller who may write, and no lease
// where there is no fast path. Input: a
// byte choosing the request (Match, Get, LeaseBlocks or a Put header), the
// caller (an admin, or a tenant of namespaces "a" and "b" as a reader or
// a writer) and the namespaces served (any, or "default" and "a"), then
// the request in wire form.
#include <memory>
#include <string>
#include <vector>

#include "services/cache/server/request_planner.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/layouts.h"

namespace kvtier::fuzz {
namespace {

enum Kind { kMatch, kGet, kLease, kPut };

std::shared_ptr<const Caller> CallerFor(uint8_t choice) {
  auto caller = std::make_shared<Caller>();
  if (choice % 3 != 0) {
    caller->tenant = "acme";
    caller->role = choice % 3 == 1 ? v1::READER : v1::WRITER;
    caller->namespaces = {"a", "b"};
    caller->default_namespace = "a";
  }
  return caller;
}

}  // namespace

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  const std::vector<kvblock::LatentLayout> layouts = Layouts();
  for (size_t i = 0; i < layouts.size(); ++i) {
    const v1::LatentLayout layout = kvblock::LayoutToProto(layouts[i]);
    const std::string hash(32, static_cast<char>('h' + i));
    v1::MatchRequest match;
    match.set_kv_namespace("a");
    *match.mutable_layout() = layout;
    match.add_block_hashes(hash);
    match.set_acquire_lease(true);
    seeds.push_back(std::string(1, static_cast<char>(kMatch | 2 << 2)) + match.SerializeAsString());
    v1::GetRequest get;
    get.set_kv_namespace("a");
    *get.mutable_layout() = layout;
    get.add_block_hashes(hash);
    get.set_layer_begin(1);
    get.set_layer_count(layouts[i].IsV4() ? 0 : 1);
    seeds.push_back(std::string(1, static_cast<char>(kGet | 1 << 2)) + get.SerializeAsString());
    v1::LeaseBlocksRequest lease;
    lease.set_kv_namespace("default");
    *lease.mutable_layout() = layout;
    lease.add_block_hashes(hash);
    seeds.push_back(std::string(1, static_cast<char>(kLease)) + lease.SerializeAsString());
    v1::PutHeader put;
    put.set_kv_namespace("b");
    *put.mutable_layout() = layout;
    seeds.push_back(std::string(1, static_cast<char>(kPut | 2 << 2)) + put.SerializeAsString());
  }
  return seeds;
}

}  // namespace kvtier::fuzz

namespace {

using namespace kvtier;

// What every accepted request's scope must be.
void CheckScope(const Caller& caller, const cache::RequestScope& scope, bool any_namespace,
                const v1::LatentLayout& asked) {
  KVTIER_FUZZ_CHECK(caller.MayUse(scope.ns));
  KVTIER_FUZZ_CHECK(any_namespace || scope.ns == "default" || scope.ns == "a");
  const absl::StatusOr<kvblock::LatentLayout> layout = kvblock::LayoutFromProto(asked);
  KVTIER_FUZZ_CHECK(layout.ok() && *layout == scope.layout);
  KVTIER_FUZZ_CHECK(scope.layout_id == kvblock::LayoutId(scope.layout));
}

void CheckHashes(const std::vector<kvblock::BlockHash>& hashes,
                 const google::protobuf::RepeatedPtrField<std::string>& asked) {
  KVTIER_FUZZ_CHECK(hashes.size() == static_cast<size_t>(asked.size()));
  KVTIER_FUZZ_CHECK(hashes.size() <= cache::kMaxBlocksPerRequest);
  for (int i = 0; i < asked.size(); ++i) {
    KVTIER_FUZZ_CHECK(asked[i].size() == 32 &&
                      std::equal(asked[i].begin(), asked[i].end(), reinterpret_cast<const char*>(hashes[i].data())));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t choice = data[0];
  const bool any_namespace = choice & 0x80;
  const std::shared_ptr<const Caller> caller = fuzz::CallerFor(choice >> 2);
  const cache::RequestPlanner planner(
      any_namespace ? std::vector<std::string>{} : std::vector<std::string>{"default", "a"}, nullptr);
  const uint8_t* message = data + 1;
  const int bytes = static_cast<int>(size - 1);
  switch (choice & 3) {
    case fuzz::kMatch: {
      v1::MatchRequest request;
      if (!request.ParseFromArray(message, bytes)) return 0;
      const absl::StatusOr<cache::BlocksPlan> plan = planner.PlanMatch(caller, request);
      if (!plan.ok()) return 0;
      CheckScope(*caller, plan->scope, any_namespace, request.layout());
      CheckHashes(plan->hashes, request.block_hashes());
      KVTIER_FUZZ_CHECK(plan->lease_ttl.has_value() == request.acquire_lease());
      return 0;
    }
    case fuzz::kGet: {
      v1::GetRequest request;
      if (!request.ParseFromArray(message, bytes)) return 0;
      const absl::StatusOr<cache::GetPlan> plan = planner.PlanGet(caller, request);
      if (!plan.ok()) return 0;
      CheckScope(*caller, plan->scope, any_namespace, request.layout());
      CheckHashes(plan->hashes, request.block_hashes());
      const uint32_t layers = plan->scope.layout.num_layers;
      KVTIER_FUZZ_CHECK(plan->layer_count >= 1 && plan->layer_begin < layers &&
                        plan->layer_count <= layers - plan->layer_begin);
      KVTIER_FUZZ_CHECK(!plan->scope.layout.IsV4() || plan->layer_count == layers);
      return 0;
    }
    case fuzz::kLease: {
      v1::LeaseBlocksRequest request;
      if (!request.ParseFromArray(message, bytes)) return 0;
      KVTIER_FUZZ_CHECK(!planner.PlanLease(caller, request).ok());  // no leases without a fast path
      return 0;
    }
    default: {
      v1::PutHeader header;
      if (!header.ParseFromArray(message, bytes)) return 0;
      const absl::StatusOr<cache::PutPlan> plan = planner.PlanPut(caller, header);
      if (!plan.ok()) return 0;
      CheckScope(*caller, plan->scope, any_namespace, header.layout());
      KVTIER_FUZZ_CHECK(caller->MayWrite());
      KVTIER_FUZZ_CHECK(plan->staging == nullptr);  // no fast path here: no session to name
      return 0;
    }
  }
}
