#include "services/cache/server/put_reactor.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/cache/server/put_message.h"
#include "services/cache/server/reactor_support.h"
#include "services/kvblock/block_format.h"
#include "services/rpc/caller.h"
#include "services/rpc/grpc_status.h"

namespace kvtier::cache {
namespace {

// Applies a Put stream's messages in order on the executor, while reads run
// ahead by up to kReadAhead messages so that the network and the store work
// overlap. Memory per stream stays bounded by that window. Messages arrive
// raw and are parsed here: a message that does not parse is answered
// INVALID_ARGUMENT (typed, gRPC would end the stream there as if the client
// had closed it, and the Put would answer OK).
class PutReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer>, public IdleStream {
 public:
  static constexpr size_t kReadAhead = 8;

  PutReactor(CacheService* service, const grpc::CallbackServerContext* context,
             absl::StatusOr<std::shared_ptr<const Caller>> caller, grpc::ByteBuffer* response)
      : service_(service), context_(context), response_(response), timer_(service->metrics(), "Put") {
    Step step;
    {
      absl::MutexLock lock(&mu_);
      if (caller.ok()) {
        caller_ = *std::move(caller);
        reading_ = true;
        step.start_read = true;
        progress_since_ = absl::Now();
        if (service->idle_puts() != nullptr) {
          service->idle_puts()->Add(this);
          watched_ = true;
        }
      } else {
        error_ = ToGrpcStatus(caller.status());
        step = PlanLocked();
      }
    }
    Run(step);
  }

  void OnReadDone(bool ok) override {
    Step step;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (ok) {
        queue_.emplace_back().Swap(&request_);
      } else {
        closed_ = true;  // the client closed its side, or the call ended
      }
      step = PlanLocked();
    }
    Run(step);
  }

  void OnDone() override {
    if (watched_) service_->idle_puts()->Remove(this);
    DeleteWhenDone(this, mu_);
  }

  // Ends the stream when its client has sent no slice since before
  // `cutoff`: messages that carry none (an empty batch) do not keep it, and
  // its incomplete blocks, alive. Not while the store is behind (then it
  // reads ahead).
  void ExpireIfIdleSince(absl::Time cutoff) override {
    Step step;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || error_.has_value() || processing_ || !queue_.empty() || !reading_ || progress_since_ >= cutoff) {
        return;
      }
      const std::string why = absl::StrCat("no slice stored for ", absl::FormatDuration(service_->idle_puts()->limit()),
                                           ": stream ended, its incomplete blocks dropped");
      static RateLimitedLog log(LogLevel::kWarning, "put");
      log(absl::StrCat(caller_->Describe(), ": ", why));
      error_ = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, why);
      step = PlanLocked();
    }
    Run(step);  // may delete this
  }

 private:
  // What to do next, decided under the lock, done outside it (Finish may
  // run OnDone, which deletes this, inline).
  struct Step {
    bool start_read = false;
    bool submit = false;
    std::optional<grpc::Status> finish;  // set: build the answer and finish
  };

  Step PlanLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Step step;
    if (finished_) return step;
    const bool drained = closed_ && queue_.empty();
    if (error_.has_value() || drained) {
      // A read may still be outstanding after an error; gRPC completes it
      // (not ok) before OnDone. The executor task must be gone, though.
      if (!processing_) {
        finished_ = true;
        step.finish = error_.value_or(grpc::Status::OK);
      }
      return step;
    }
    if (!processing_ && !queue_.empty()) {
      processing_ = true;
      step.submit = true;
    }
    if (!reading_ && !closed_ && queue_.size() < kReadAhead) {
      reading_ = true;
      step.start_read = true;
    }
    return step;
  }

  void Run(const Step& step) {
    if (step.finish.has_value()) {
      grpc::Status status = *step.finish;
      if (status.ok()) status = Answer();
      timer_.Done(status.error_code());
      Finish(status);  // may delete this
      return;
    }
    // While processing_ is set the stream cannot finish, so this stays alive.
    if (step.start_read) StartRead(&request_);
    if (!step.submit) return;
    if (service_->executor()->TrySubmit([this] { Drain(); })) return;
    Step next;
    {
      absl::MutexLock lock(&mu_);
      processing_ = false;
      error_ = kBusy;
      next = PlanLocked();
    }
    Run(next);
  }

  // Applies queued messages until the queue is empty (on the executor).
  void Drain() {
    while (true) {
      grpc::ByteBuffer raw;
      {
        absl::ReleasableMutexLock lock(&mu_);
        if (queue_.empty() || error_.has_value()) {
          // Decided in the same critical section that ends processing: once
          // it is clear, another thread may finish the stream and free this.
          processing_ = false;
          const Step last = PlanLocked();
          lock.Release();
          Run(last);
          return;
        }
        raw.Swap(&queue_.front());
        queue_.pop_front();
      }
      ++messages_;
      const uint64_t slices_before = slices_stored_;
      absl::Status status = FollowCredentials();
      if (status.ok()) status = Apply(raw);
      Step step;
      {
        absl::MutexLock lock(&mu_);
        if (slices_stored_ > slices_before) progress_since_ = absl::Now();
        if (!status.ok()) {
          error_ = ToGrpcStatus(service_->Count(caller_->tenant, status));
          queue_.clear();
        }
        step = PlanLocked();  // processing_ is still set: at most a read
      }
      Run(step);
    }
  }

  // Once a reload takes other TLS files, the client's certificate checked
  // again; once it takes another tenants file, the caller as it says and
  // the header's rights: a client revoked, a tenant removed, made a reader
  // or taken off the namespace stores nothing more (its begun blocks are
  // dropped with the stream).
  absl::Status FollowCredentials() {
    KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<const Caller> now, followed_.Now(*context_));
    if (now != caller_ && header_.has_value()) {
      KVTIER_RETURN_IF_ERROR(service_->planner().PlanPutScope(now, *header_).status());
    }
    caller_ = std::move(now);
    return absl::OkStatus();
  }

  // A slice or a batch is read where it lies in gRPC's buffers, its
  // records copied only into the store; anything else through protobuf.
  absl::Status Apply(grpc::ByteBuffer& raw) {
    std::vector<grpc::Slice> pieces;
    if (raw.Dump(&pieces).ok()) {
      if (std::optional<std::vector<PutSliceView>> slices = ParsePutSlices(pieces, kMaxSlicesPerBatch)) {
        KVTIER_RETURN_IF_ERROR(CheckBatchSize(slices->size()));
        for (const PutSliceView& slice : *slices) {
          KVTIER_RETURN_IF_ERROR(ApplySlice(slice.block_hash, slice.data, slice.staged ? &*slice.staged : nullptr));
        }
        return absl::OkStatus();
      }
    }
    v1::PutRequest request;
    if (!grpc::SerializationTraits<v1::PutRequest>::Deserialize(&raw, &request).ok()) {
      return absl::InvalidArgumentError(absl::StrCat("Put message ", messages_, " does not parse as a PutRequest"));
    }
    return Apply(request);
  }

  static absl::Status CheckBatchSize(size_t slices) {
    if (slices <= kMaxSlicesPerBatch) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(slices, " slices in one batch, at most ", kMaxSlicesPerBatch));
  }

  absl::Status Apply(const v1::PutRequest& request) {
    switch (request.kind_case()) {
      case v1::PutRequest::kHeader: {
        if (session_ != nullptr) return absl::InvalidArgumentError("second Put header in one stream");
        KVTIER_ASSIGN_OR_RETURN(PutPlan plan, service_->planner().PlanPut(caller_, request.header()));
        header_ = request.header();
        staging_ = std::move(plan.staging);
        session_ = service_->store()->BeginPut(plan.scope.ns, plan.scope.layout, plan.scope.caller->tenant,
                                               ToOwnerQuota(plan.scope.caller->quota), request.header().cold_start());
        return absl::OkStatus();
      }
      case v1::PutRequest::kSlice:
        return ApplySlice(request.slice());
      case v1::PutRequest::kBatch: {
        KVTIER_RETURN_IF_ERROR(CheckBatchSize(request.batch().slices_size()));
        for (const v1::LayerSlice& slice : request.batch().slices()) KVTIER_RETURN_IF_ERROR(ApplySlice(slice));
        return absl::OkStatus();
      }
      case v1::PutRequest::KIND_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError("Put message with neither header nor slice");
  }

  absl::Status ApplySlice(const v1::LayerSlice& slice) {
    const std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(slice.data().data()), slice.data().size());
    return ApplySlice(slice.block_hash(), std::span(&data, 1), slice.has_staged() ? &slice.staged() : nullptr);
  }

  // A slice's record, in pieces (`data`) or `staged`.
  absl::Status ApplySlice(const std::string& block_hash, std::span<const std::span<const uint8_t>> data,
                          const v1::StagedRange* staged) {
    if (session_ == nullptr) return absl::InvalidArgumentError("the first Put message must be a header");
    KVTIER_ASSIGN_OR_RETURN(kvblock::BlockHash hash, kvblock::HashFromBytes(block_hash));
    if (staged == nullptr) return Counted(session_->AddSlice(hash, data));
    if (staging_ == nullptr) {
      return absl::InvalidArgumentError(
          "a staged slice needs a header naming a fast path session with a staging region");
    }
    KVTIER_ASSIGN_OR_RETURN(std::string_view range, staging_->Range(staged->offset(), staged->length()));
    // Copied out first: the client can write its region at any time, and
    // what is checked must be what is stored.
    staged_copy_.assign(range.data(), range.size());
    service_->fast_path()->CountStaged(range.size());
    return Counted(session_->AddSlice(hash, staged_copy_));
  }

  absl::Status Counted(absl::Status added) {
    if (added.ok()) ++slices_stored_;
    return added;
  }

  // The successful end: what this stream stored.
  grpc::Status Answer() {
    if (session_ == nullptr) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Put stream carried no header");
    }
    PutSummary summary = session_->Finish();
    v1::PutResponse response;
    response.set_blocks_stored(summary.blocks_stored);
    response.set_blocks_deduplicated(summary.blocks_deduplicated);
    for (const auto& h : summary.incomplete) {
      response.add_incomplete_block_hashes(std::string(kvblock::HashAsBytes(h)));
    }
    bool own = false;
    return grpc::SerializationTraits<v1::PutResponse>::Serialize(response, response_, &own);
  }

  CacheService* service_;
  const grpc::CallbackServerContext* context_;
  grpc::ByteBuffer* response_;
  RpcTimer timer_;
  std::shared_ptr<const Caller> caller_;  // set before the first read; by Drain after
  std::optional<v1::PutHeader> header_;   // once applied
  bool watched_ = false;                  // in idle_puts, from before the first read
  grpc::ByteBuffer request_;              // the one read in flight; owned by whoever set reading_
  int messages_ = 0;                      // parsed so far, by Drain
  uint64_t slices_stored_ = 0;            // by Drain: its progress
  FollowedCaller followed_;               // caller_ as the files in force say, by Drain
  // Used by one Drain task at a time (processing_), then by Answer; freed in
  // OnDone, taking incomplete blocks with it.
  std::unique_ptr<PutSession> session_;
  std::shared_ptr<const StagingRegion> staging_;  // with a fast path session
  std::string staged_copy_;

  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool processing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> error_ ABSL_GUARDED_BY(mu_);
  // When a slice was last stored (or the stream opened): a stream without
  // progress for --put-idle-ms ends, however many messages it sends.
  absl::Time progress_since_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* NewPutReactor(CacheService* service,
                                                         const grpc::CallbackServerContext* context,
                                                         absl::StatusOr<std::shared_ptr<const Caller>> caller,
                                                         grpc::ByteBuffer* response) {
  return new PutReactor(service, context, std::move(caller), response);
}

}  // namespace kvtier::cache
