// A blocking client of kvtier.v1.KvCache, with a deadline on every call: what
// the prefill node, the decode worker, `kvtier stats` and the tests use.
// Thread-safe (gRPC stubs are).
#ifndef KVTIER_SERVICES_CACHE_CLIENT_CACHE_CLIENT_H_
#define KVTIER_SERVICES_CACHE_CLIENT_CACHE_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "services/kvblock/block_key.h"
#include "services/kvblock/layout.h"

namespace kvtier::cache {

struct BlockSlices {
  kvblock::BlockHash hash;
  std::vector<std::string> records;  // block-format slice records
  // Stored on the shard of this key instead of `hash`'s (a DeepSeek-V4
  // restore point beside its block).
  std::optional<kvblock::BlockHash> shard_key = std::nullopt;
};

// One Get answer: the record, or why there is none.
struct FetchedBlock {
  absl::Status status;  // OK, NOT_FOUND, DATA_LOSS, ...
  std::string record;
  v1::Tier tier = v1::TIER_UNSPECIFIED;
};

class CacheClient {
 public:
  // `channel`: MakeChannel's (services/rpc/client_identity.h).
  explicit CacheClient(std::shared_ptr<grpc::Channel> channel, absl::Duration deadline = absl::Seconds(30));

  absl::StatusOr<v1::MatchResponse> Match(const std::string& ns, const kvblock::LatentLayout& layout,
                                          const std::vector<kvblock::BlockHash>& hashes, bool acquire_lease = false,
                                          uint32_t lease_ttl_ms = 0);
  // One Put stream: the header, then each block's slices in a message
  // (in wire form over the records themselves: put_wire.h). `cold_start`:
  // PutHeader's (IsColdStart, put_wire.h).
  absl::StatusOr<v1::PutResponse> Put(const std::string& ns, const kvblock::LatentLayout& layout,
                                      const std::vector<BlockSlices>& blocks, bool cold_start = false);
  // One Get stream; answers in request order. Errors of the stream itself
  // (bad request, cancelled) are the returned status.
  absl::StatusOr<std::vector<FetchedBlock>> Get(const std::string& ns, const kvblock::LatentLayout& layout,
                                                const std::vector<kvblock::BlockHash>& hashes, uint64_t lease_id = 0);
  absl::Status ReleaseLease(uint64_t lease_id);
  absl::StatusOr<v1::StatsResponse> Stats();

  // Every later call is for end tenant `tenant` (kActingForMetadata): the
  // cache charges it, and holds it to its quota, role and namespaces, when
  // this client's own identity is a service's. Empty: calls for itself.
  void ActFor(std::string tenant) { acting_for_ = std::move(tenant); }

  v1::KvCache::Stub& stub() { return *stub_; }
  // What every call's context carries: the deadline, and the end tenant
  // the client acts for.
  void SetDeadline(grpc::ClientContext& context) const;

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  absl::Duration deadline_;
  std::string acting_for_;
};

// The GetRequest for `hashes` (all layers), as CacheClient::Get sends it.
v1::GetRequest MakeGetRequest(const std::string& ns, const kvblock::LatentLayout& layout,
                              const std::vector<kvblock::BlockHash>& hashes, uint64_t lease_id = 0);

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_CLIENT_CACHE_CLIENT_H_
