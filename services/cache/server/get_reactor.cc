#include "services/cache/server/get_reactor.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "services/base/status.h"
#include "services/cache/server/get_response.h"
#include "services/cache/server/reactor_support.h"
#include "services/kvblock/block_format.h"
#include "services/rpc/caller.h"
#include "services/rpc/grpc_status.h"

namespace kvtier::cache {
namespace {

// Writes blocks in order, one write in flight, and prepares (reads, verifies)
// the next block while the current one is being sent: at most two blocks
// are held, however slowly the client reads.
class GetReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GetReactor(CacheService* service, const grpc::CallbackServerContext* context,
             absl::StatusOr<std::shared_ptr<const Caller>> caller, const grpc::ByteBuffer* raw)
      : service_(service), context_(context), timer_(service->metrics(), "Get") {
    const std::string tenant = caller.ok() ? (*caller)->tenant : "";
    absl::Status status = caller.ok() ? service->Count(tenant, Parse(*std::move(caller), raw)) : caller.status();
    Step step;
    {
      absl::MutexLock lock(&mu_);
      if (!status.ok()) final_status_ = ToGrpcStatus(status);
      step = PlanLocked();
    }
    Run(step);
  }

  void OnWriteDone(bool ok) override {
    Step step;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "client stopped reading");
      } else {
        ++sent_;
      }
      step = PlanLocked();
    }
    Run(step);
  }

  void OnDone() override { DeleteWhenDone(this, mu_); }

 private:
  absl::Status Parse(std::shared_ptr<const Caller> caller, const grpc::ByteBuffer* raw) {
    grpc::ByteBuffer copy(*raw);  // shares the slices
    v1::GetRequest request;
    if (!grpc::SerializationTraits<v1::GetRequest>::Deserialize(&copy, &request).ok()) {
      return absl::InvalidArgumentError("GetRequest does not parse");
    }
    KVTIER_ASSIGN_OR_RETURN(plan_, service_->planner().PlanGet(std::move(caller), request));
    return absl::OkStatus();
  }

  // What to do next, decided under the lock and done outside it: gRPC may
  // run OnDone (which deletes this) inline from Finish.
  struct Step {
    bool start_write = false;
    bool submit = false;
    size_t index = 0;
    std::optional<grpc::Status> finish;
  };

  Step PlanLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Step step;
    if (finished_) return step;
    if (!final_status_.has_value() && sent_ == plan_.hashes.size()) final_status_ = grpc::Status::OK;
    if (final_status_.has_value()) {
      // Never finish while a Produce task or a write may still touch this.
      if (!producing_ && !writing_) {
        finished_ = true;
        step.finish = final_status_;
      }
      return step;
    }
    if (!writing_ && prepared_.has_value()) {
      current_.Swap(&*prepared_);  // ByteBuffer has no move: a copy would ref every slice again
      prepared_.reset();
      writing_ = true;
      step.start_write = true;
    }
    if (!producing_ && !prepared_.has_value() && next_ < plan_.hashes.size()) {
      producing_ = true;
      step.submit = true;
      step.index = next_++;
    }
    return step;
  }

  void Run(const Step& step) {
    if (step.finish.has_value()) {
      // Before Finish, so a client that sees the stream end sees the lease
      // ended too.
      if (plan_.lease_id != 0) (void)service_->store()->ReleaseLease(plan_.lease_id, plan_.scope.caller->tenant);
      if (step.finish->ok()) service_->store()->Refresh(plan_.scope.ns, plan_.scope.layout_id, plan_.hashes);
      if (service_->metrics() != nullptr && plan_.scope.caller != nullptr) {
        service_->metrics()->CountBlocks(plan_.scope.caller->tenant, found_, missed_);
      }
      timer_.Done(step.finish->error_code());
      Finish(*step.finish);  // may delete this
      return;
    }
    // While producing_ is set (as it is until the task below runs), the
    // stream cannot finish, so this stays alive through both calls.
    if (step.start_write) StartWrite(&current_);
    if (!step.submit) return;
    const size_t index = step.index;
    if (service_->executor()->TrySubmit([this, index] { Produce(index); })) return;
    Step next;
    {
      absl::MutexLock lock(&mu_);
      producing_ = false;
      final_status_ = kBusy;
      next = PlanLocked();
    }
    Run(next);
  }

  // Reads block `index` into a ready-to-write buffer (on the executor).
  void Produce(size_t index) {
    const absl::Status rights = FollowCredentials();
    grpc::ByteBuffer buffer;
    if (rights.ok()) buffer = Encode(index);
    Step step;
    {
      absl::MutexLock lock(&mu_);
      producing_ = false;
      if (rights.ok()) {
        prepared_ = std::move(buffer);
      } else {
        final_status_ = ToGrpcStatus(service_->Count(plan_.scope.caller->tenant, rights));
      }
      step = PlanLocked();
    }
    Run(step);
  }

  // A Get of many blocks, read slowly, may outlive its tenants file and its
  // TLS files: once a reload takes others, the client's certificate, the
  // caller as the file says and its right to the namespace are checked
  // again before the next block.
  absl::Status FollowCredentials() {
    KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<const Caller> now, followed_.Now(*context_));
    if (now != plan_.scope.caller) KVTIER_RETURN_IF_ERROR(CheckNamespace(*now, plan_.scope.ns));
    plan_.scope.caller = std::move(now);
    return absl::OkStatus();
  }

  grpc::ByteBuffer Encode(size_t index) {
    GetAnswer answer = service_->ReadForGet(plan_, index);
    ++(answer.record != nullptr || answer.miss.ok() ? found_ : missed_);
    if (answer.record != nullptr) {
      return EncodeBlockResponse(static_cast<uint32_t>(index), plan_.hashes[index], answer.record);
    }
    v1::GetResponse response;
    response.set_index(static_cast<uint32_t>(index));
    response.set_block_hash(std::string(kvblock::HashAsBytes(plan_.hashes[index])));
    if (answer.miss.ok()) {
      response.set_tier(answer.tier);
      response.set_data(std::move(answer.subset));
    } else {
      response.mutable_miss()->set_code(static_cast<int>(answer.miss.code()));
      response.mutable_miss()->set_message(std::string(answer.miss.message()));
    }
    return EncodeResponse(response);
  }

  CacheService* service_;
  const grpc::CallbackServerContext* context_;
  RpcTimer timer_;
  GetPlan plan_;  // set by Parse, before any task runs; its caller by Produce after
  // Blocks answered and missed, counted by whoever runs Produce (one at a
  // time), reported once as the stream finishes.
  uint64_t found_ = 0, missed_ = 0;
  FollowedCaller followed_;  // plan_.scope.caller's as the files in force say, by Produce

  absl::Mutex mu_;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;  // next block to prepare
  size_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  bool producing_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> final_status_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::ByteBuffer> prepared_ ABSL_GUARDED_BY(mu_);
  // The one write in flight; only touched by whoever set writing_.
  grpc::ByteBuffer current_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewGetReactor(CacheService* service,
                                                          const grpc::CallbackServerContext* context,
                                                          absl::StatusOr<std::shared_ptr<const Caller>> caller,
                                                          const grpc::ByteBuffer* request) {
  return new GetReactor(service, context, std::move(caller), request);
}

}  // namespace kvtier::cache
