#include "services/cache/client/put_route.h"

#include "services/rpc/tenants.h"

namespace kvtier::cache {

std::unique_ptr<PutStream> PutRoute::Open(const std::string& ns, const kvblock::LatentLayout& layout,
                                          const std::string& acting_for, bool cold_start) {
  if (down_()) return nullptr;
  std::unique_ptr<PutStream> s(new PutStream());
  v1::PutHeader header;
  for (const std::unique_ptr<ShardRoute>& route : *read_routes_) {
    if ((s->fast_ = route->PutStaging()) != nullptr) {
      s->staging_route_ = route.get();
      break;
    }
  }
  if (s->fast_ != nullptr) {
    s->staged_ = std::make_unique<FastPathClient::StagedStream>(s->fast_.get());
    header.set_fast_path_session_id(s->fast_->session_id());
  }
  s->connection_.emplace(connections_->Take());
  if (!acting_for.empty()) s->context_.AddMetadata(kActingForMetadata, acting_for);
  s->writer_ = OpenRawPut(s->connection_->channel(), &s->context_, &s->response_);
  header.set_kv_namespace(ns);
  *header.mutable_layout() = kvblock::LayoutToProto(layout);
  header.set_cold_start(cold_start);
  s->open_ = s->writer_->Write(PutHeaderMessage(header));
  return s;
}

PutStream::~PutStream() {
  if (finished_) return;
  Cancel();
  Finish();
}

void PutStream::Write(const kvblock::BlockHash& hash, std::shared_ptr<const std::string> record) {
  if (!open_) return;
  written_.insert(hash);
  if (std::optional<v1::StagedRange> staged = staged_ != nullptr ? staged_->Stage(*record) : std::nullopt) {
    batch_.AddStaged(hash, *staged);
  } else {
    batch_.AddInline(hash, std::move(record));
  }
  if (batch_.slices() >= kSlicesPerMessage || batch_.inline_bytes() >= kInlineBytesPerMessage) FlushBatch();
}

void PutStream::Flush() { FlushBatch(); }

void PutStream::FlushBatch() {
  if (!open_ || batch_.slices() == 0) return;
  open_ = writer_->Write(batch_.Take());
}

std::set<kvblock::BlockHash> PutStream::Finish() {
  finished_ = true;
  FlushBatch();
  if (open_) writer_->WritesDone();
  const grpc::Status status = writer_->Finish();
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION && fast_ != nullptr) {
    staging_route_->SessionFailed(fast_);  // e.g. the cache restarted
  }
  std::set<kvblock::BlockHash> stored;
  if (!status.ok()) return stored;
  const std::set<std::string> incomplete(response_.incomplete_block_hashes().begin(),
                                         response_.incomplete_block_hashes().end());
  for (const kvblock::BlockHash& h : written_) {
    if (!incomplete.count(std::string(kvblock::HashAsBytes(h)))) stored.insert(h);
  }
  return stored;
}

}  // namespace kvtier::cache
