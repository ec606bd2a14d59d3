#include "services/cache/client/cache_client.h"

#include "absl/strings/str_cat.h"
#include "services/cache/client/put_wire.h"
#include "services/rpc/client_identity.h"
#include "services/rpc/grpc_status.h"
#include "services/rpc/tenants.h"

namespace kvtier::cache {

CacheClient::CacheClient(std::shared_ptr<grpc::Channel> channel, absl::Duration deadline)
    : channel_(channel), stub_(v1::KvCache::NewStub(channel)), deadline_(deadline) {}

void CacheClient::SetDeadline(grpc::ClientContext& context) const {
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
  if (!acting_for_.empty()) context.AddMetadata(kActingForMetadata, acting_for_);
}

absl::StatusOr<v1::MatchResponse> CacheClient::Match(const std::string& ns, const kvblock::LatentLayout& layout,
                                                     const std::vector<kvblock::BlockHash>& hashes, bool acquire_lease,
                                                     uint32_t lease_ttl_ms) {
  v1::MatchRequest request;
  request.set_kv_namespace(ns);
  *request.mutable_layout() = kvblock::LayoutToProto(layout);
  for (const auto& h : hashes) request.add_block_hashes(std::string(kvblock::HashAsBytes(h)));
  request.set_acquire_lease(acquire_lease);
  request.set_lease_ttl_ms(lease_ttl_ms);
  grpc::ClientContext context;
  SetDeadline(context);
  v1::MatchResponse response;
  if (grpc::Status s = stub_->Match(&context, request, &response); !s.ok()) return FromGrpcStatus(s);
  return response;
}

absl::StatusOr<v1::PutResponse> CacheClient::Put(const std::string& ns, const kvblock::LatentLayout& layout,
                                                 const std::vector<BlockSlices>& blocks, bool cold_start) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::PutResponse response;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer = OpenRawPut(channel_.get(), &context, &response);
  v1::PutHeader header;
  header.set_kv_namespace(ns);
  *header.mutable_layout() = kvblock::LayoutToProto(layout);
  header.set_cold_start(cold_start);
  bool open = writer->Write(PutHeaderMessage(header));
  PutBatchWire batch;
  for (const BlockSlices& block : blocks) {
    if (!open) break;
    // `blocks` outlives the stream: this call returns after its end.
    for (const std::string& record : block.records) batch.AddInline(block.hash, Borrowed(record));
    open = writer->Write(batch.Take());
  }
  writer->WritesDone();
  if (grpc::Status s = writer->Finish(); !s.ok()) return FromGrpcStatus(s);
  return response;
}

absl::StatusOr<std::vector<FetchedBlock>> CacheClient::Get(const std::string& ns, const kvblock::LatentLayout& layout,
                                                           const std::vector<kvblock::BlockHash>& hashes,
                                                           uint64_t lease_id) {
  const v1::GetRequest request = MakeGetRequest(ns, layout, hashes, lease_id);
  grpc::ClientContext context;
  SetDeadline(context);
  std::unique_ptr<grpc::ClientReader<v1::GetResponse>> reader = stub_->Get(&context, request);
  std::vector<FetchedBlock> blocks(hashes.size());
  v1::GetResponse response;
  while (reader->Read(&response)) {
    if (response.index() >= blocks.size()) {
      context.TryCancel();
      return absl::InternalError(absl::StrCat("server answered for index ", response.index()));
    }
    FetchedBlock& b = blocks[response.index()];
    b.tier = response.tier();
    if (response.has_miss()) {
      b.status = absl::Status(static_cast<absl::StatusCode>(response.miss().code()), response.miss().message());
    } else {
      b.record = std::move(*response.mutable_data());
    }
  }
  if (grpc::Status s = reader->Finish(); !s.ok()) return FromGrpcStatus(s);
  return blocks;
}

v1::GetRequest MakeGetRequest(const std::string& ns, const kvblock::LatentLayout& layout,
                              const std::vector<kvblock::BlockHash>& hashes, uint64_t lease_id) {
  v1::GetRequest request;
  request.set_kv_namespace(ns);
  *request.mutable_layout() = kvblock::LayoutToProto(layout);
  for (const auto& h : hashes) request.add_block_hashes(std::string(kvblock::HashAsBytes(h)));
  request.set_lease_id(lease_id);
  return request;
}

absl::Status CacheClient::ReleaseLease(uint64_t lease_id) {
  v1::ReleaseLeaseRequest request;
  request.set_lease_id(lease_id);
  grpc::ClientContext context;
  SetDeadline(context);
  v1::ReleaseLeaseResponse response;
  return FromGrpcStatus(stub_->ReleaseLease(&context, request, &response));
}

absl::StatusOr<v1::StatsResponse> CacheClient::Stats() {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::StatsResponse response;
  if (grpc::Status s = stub_->Stats(&context, v1::StatsRequest(), &response); !s.ok()) {
    return FromGrpcStatus(s);
  }
  return response;
}

}  // namespace kvtier::cache
