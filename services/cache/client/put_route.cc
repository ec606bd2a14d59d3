#include "services/cache/client/put_route.h"

#include "services/rpc/tenants.h"

namespace kvtier::cache {

std::unique_ptr<PutStream> PutRoute::Open(const std::string& ns, const kvblock::LatentLayout& layout,
                                          const std::string& acting_for) {
  if (down_()) return nullptr;
  std::unique_ptr<PutStream> s(new PutStream());
  v1::PutRequest header;
  for (const std::unique_ptr<ShardRoute>& route : *read_routes_) {
    if ((s->fast_ = route->PutStaging()) != nullptr) {
      s->staging_route_ = route.get();
      break;
    }
  }
  if (s->fast_ != nullptr) {
    s->staged_ = std::make_unique<FastPathClient::StagedStream>(s->fast_.get());
    header.mutable_header()->set_fast_path_session_id(s->fast_->session_id());
  }
  s->connection_.emplace(connections_->Take());
  if (!acting_for.empty()) s->context_.AddMetadata(kActingForMetadata, acting_for);
  s->writer_ = s->connection_->stub().Put(&s->context_, &s->response_);
  header.mutable_header()->set_kv_namespace(ns);
  *header.mutable_header()->mutable_layout() = kvblock::LayoutToProto(layout);
  s->open_ = s->writer_->Write(header);
  return s;
}

PutStream::~PutStream() {
  if (finished_) return;
  Cancel();
  Finish();
}

void PutStream::Write(const kvblock::BlockHash& hash, const std::string& record) {
  if (!open_) return;
  written_.insert(hash);
  v1::LayerSlice* batched = batch_.mutable_batch()->add_slices();
  batched->set_block_hash(std::string(kvblock::HashAsBytes(hash)));
  if (std::optional<v1::StagedRange> staged = staged_ != nullptr ? staged_->Stage(record) : std::nullopt) {
    *batched->mutable_staged() = *staged;
  } else {
    batched->set_data(record);
    inline_bytes_ += record.size();
  }
  if (batch_.batch().slices_size() >= kSlicesPerMessage || inline_bytes_ >= kInlineBytesPerMessage) FlushBatch();
}

void PutStream::Flush() { FlushBatch(); }

void PutStream::FlushBatch() {
  if (!open_ || batch_.batch().slices_size() == 0) return;
  open_ = writer_->Write(batch_);
  batch_.mutable_batch()->clear_slices();
  inline_bytes_ = 0;
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
