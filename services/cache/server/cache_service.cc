#include "services/cache/server/cache_service.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "services/cache/server/get_response.h"
#include "services/common/log.h"
#include "services/common/status.h"
#include "services/kvblock/block_format.h"

namespace kvtier::cache {
namespace {

// Times an RPC from construction to Done(code).
class RpcTimer {
 public:
  RpcTimer(RpcMetrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)), start_(absl::Now()) {}
  void Done(grpc::StatusCode code) {
    if (metrics_ != nullptr) metrics_->Observe(method_, code, absl::Now() - start_);
  }

 private:
  RpcMetrics* metrics_;
  std::string method_;
  absl::Time start_;
};

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, RpcTimer timer,
                                      const absl::Status& status) {
  const grpc::Status g = ToGrpcStatus(status);
  timer.Done(g.error_code());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(g);
  return reactor;
}

// Deletes a reactor from its OnDone. The thread that decided to finish let
// go of the reactor's `mu` after its last touch of it; taking `mu` once
// here orders that before the delete, whatever gRPC's hand-off to this
// thread does.
template <typename Reactor>
void DeleteWhenDone(Reactor* reactor, absl::Mutex& mu) {
  { absl::MutexLock lock(&mu); }
  delete reactor;
}

const grpc::Status kBusy(grpc::StatusCode::RESOURCE_EXHAUSTED,
                         "kvtier-cache is at its work-queue limit; retry with backoff");

// ---- Put ----

// Applies a Put stream's messages in order on the executor, while reads run
// ahead by up to kReadAhead messages so that the network and the store work
// overlap. Memory per stream stays bounded by that window. Messages arrive
// raw and are parsed here: a message that does not parse is answered
// INVALID_ARGUMENT (typed, gRPC would end the stream there as if the client
// had closed it, and the Put would answer OK).
class PutReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer>, public IdleStream {
 public:
  static constexpr size_t kReadAhead = 8;

  PutReactor(CacheService* service, absl::StatusOr<std::shared_ptr<const Caller>> caller, grpc::ByteBuffer* response)
      : service_(service), response_(response), timer_(service->metrics(), "Put") {
    Step step;
    {
      absl::MutexLock lock(&mu_);
      if (caller.ok()) {
        caller_ = *std::move(caller);
        reading_ = true;
        step.start_read = true;
        waiting_since_ = absl::Now();
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
      waiting_since_ = absl::Now();
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

  // Ends the stream when it has waited for the client's next message since
  // before `cutoff` (not when the store is behind: then it reads ahead).
  void ExpireIfIdleSince(absl::Time cutoff) override {
    Step step;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || error_.has_value() || processing_ || !queue_.empty() || !reading_ || waiting_since_ >= cutoff) {
        return;
      }
      const std::string why = absl::StrCat("no Put message for ", absl::FormatDuration(service_->idle_puts()->limit()),
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
          waiting_since_ = absl::Now();
          const Step last = PlanLocked();
          lock.Release();
          Run(last);
          return;
        }
        raw.Swap(&queue_.front());
        queue_.pop_front();
      }
      ++messages_;
      v1::PutRequest request;
      absl::Status status =
          grpc::SerializationTraits<v1::PutRequest>::Deserialize(&raw, &request).ok()
              ? Apply(request)
              : absl::InvalidArgumentError(absl::StrCat("Put message ", messages_, " does not parse as a PutRequest"));
      Step step;
      {
        absl::MutexLock lock(&mu_);
        if (!status.ok()) {
          error_ = ToGrpcStatus(service_->Count(caller_->tenant, status));
          queue_.clear();
        }
        step = PlanLocked();  // processing_ is still set: at most a read
      }
      Run(step);
    }
  }

  absl::Status Apply(const v1::PutRequest& request) {
    switch (request.kind_case()) {
      case v1::PutRequest::kHeader: {
        if (session_ != nullptr) return absl::InvalidArgumentError("second Put header in one stream");
        KVTIER_ASSIGN_OR_RETURN(PutPlan plan, service_->planner().PlanPut(caller_, request.header()));
        staging_ = std::move(plan.staging);
        const v1::TenantQuota& quota = plan.scope.caller->quota;
        session_ = service_->store()->BeginPut(
            plan.scope.ns, plan.scope.layout, plan.scope.caller->tenant,
            OwnerQuota{{quota.device_bytes(), quota.host_bytes(), quota.disk_bytes()}, quota.put_bytes_in_flight()});
        return absl::OkStatus();
      }
      case v1::PutRequest::kSlice:
        return ApplySlice(request.slice());
      case v1::PutRequest::kBatch: {
        if (request.batch().slices_size() > kMaxSlicesPerBatch) {
          return absl::InvalidArgumentError(
              absl::StrCat(request.batch().slices_size(), " slices in one batch, at most ", kMaxSlicesPerBatch));
        }
        for (const v1::LayerSlice& slice : request.batch().slices()) KVTIER_RETURN_IF_ERROR(ApplySlice(slice));
        return absl::OkStatus();
      }
      case v1::PutRequest::KIND_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError("Put message with neither header nor slice");
  }

  absl::Status ApplySlice(const v1::LayerSlice& slice) {
    if (session_ == nullptr) return absl::InvalidArgumentError("the first Put message must be a header");
    KVTIER_ASSIGN_OR_RETURN(kvblock::BlockHash hash, kvblock::HashFromBytes(slice.block_hash()));
    if (!slice.has_staged()) return session_->AddSlice(hash, slice.data());
    if (staging_ == nullptr) {
      return absl::InvalidArgumentError(
          "a staged slice needs a header naming a fast path session with a staging region");
    }
    KVTIER_ASSIGN_OR_RETURN(std::string_view staged, staging_->Range(slice.staged().offset(), slice.staged().length()));
    // Copied out first: the client can write its region at any time, and
    // what is checked must be what is stored.
    staged_copy_.assign(staged.data(), staged.size());
    service_->fast_path()->CountStaged(staged.size());
    return session_->AddSlice(hash, staged_copy_);
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
  grpc::ByteBuffer* response_;
  RpcTimer timer_;
  std::shared_ptr<const Caller> caller_;  // set before the first read
  bool watched_ = false;                  // in idle_puts, from before the first read
  grpc::ByteBuffer request_;              // the one read in flight; owned by whoever set reading_
  int messages_ = 0;                      // parsed so far, by Drain
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
  // Since when the stream has had nothing to do but wait for the client.
  absl::Time waiting_since_ ABSL_GUARDED_BY(mu_);
};

// ---- Get ----

// Writes blocks in order, one write in flight, and prepares (reads, verifies)
// the next block while the current one is being sent: at most two blocks
// are held, however slowly the client reads.
class GetReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GetReactor(CacheService* service, absl::StatusOr<std::shared_ptr<const Caller>> caller, const grpc::ByteBuffer* raw)
      : service_(service), timer_(service->metrics(), "Get") {
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
    grpc::ByteBuffer buffer = Encode(index);
    Step step;
    {
      absl::MutexLock lock(&mu_);
      producing_ = false;
      prepared_ = std::move(buffer);
      step = PlanLocked();
    }
    Run(step);
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
  RpcTimer timer_;
  GetPlan plan_;  // set once by Parse, before any task runs
  // Blocks answered and missed, counted by whoever runs Produce (one at a
  // time), reported once as the stream finishes.
  uint64_t found_ = 0, missed_ = 0;

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

void FillStats(const StoreStats& s, const FastPathCounters& f, v1::StatsResponse& r) {
  for (const TierCounters& t : s.tiers) {
    v1::TierStats* ts = r.add_tiers();
    ts->set_tier(static_cast<v1::Tier>(t.tier));
    ts->set_capacity_bytes(t.capacity_bytes);
    ts->set_used_bytes(t.used_bytes);
    ts->set_blocks(t.blocks);
    ts->set_hits(t.hits);
    ts->set_promotions(t.promotions);
    ts->set_demotions(t.demotions);
    ts->set_evictions(t.evictions);
    ts->set_write_errors(t.write_errors);
  }
  r.set_metadata_bytes(s.metadata_bytes);
  r.set_misses(s.misses);
  r.set_blocks_stored(s.blocks_stored);
  r.set_blocks_deduplicated(s.blocks_deduplicated);
  r.set_bytes_in(s.bytes_in);
  r.set_bytes_out(s.bytes_out);
  r.set_checksum_failures(s.checksum_failures);
  r.set_arrival_checksum_failures(s.arrival_checksum_failures);
  r.set_active_leases(s.active_leases);
  r.set_pending_blocks(s.pending_blocks);
  r.set_pinned_blocks(s.pinned_blocks);
  r.set_fast_path_sessions(f.sessions);
  r.set_fast_path_blocks_out(f.blocks_out);
  r.set_fast_path_bytes_out(f.bytes_out);
  r.set_fast_path_bytes_in(f.bytes_in);
  r.set_fast_path_staging_bytes(f.staging_bytes);
  r.set_fast_path_device_staging_bytes(f.device_staging_bytes);
  r.set_server_version(kCacheServerVersion);
  r.add_block_format_versions(kvblock::kBlockFormatVersion);
  r.add_block_format_versions(kvblock::kIndexedBlockFormatVersion);
}

void FillTenantStats(const StoreStats& s, const Caller& caller, v1::StatsResponse& r) {
  const auto used = s.used_by_owner.find(caller.tenant);
  const uint64_t quotas[] = {caller.quota.device_bytes(), caller.quota.host_bytes(), caller.quota.disk_bytes()};
  for (size_t i = 0; i < s.tiers.size(); ++i) {
    v1::TierStats* ts = r.add_tiers();
    ts->set_tier(static_cast<v1::Tier>(s.tiers[i].tier));
    ts->set_capacity_bytes(i < 3 && quotas[i] > 0 ? quotas[i] : s.tiers[i].capacity_bytes);
    if (used != s.used_by_owner.end()) ts->set_used_bytes(used->second[i]);
  }
  r.set_server_version(kCacheServerVersion);
  r.add_block_format_versions(kvblock::kBlockFormatVersion);
  r.add_block_format_versions(kvblock::kIndexedBlockFormatVersion);
}

CacheService::CacheService(BlockStore* store, Executor* executor, RpcMetrics* metrics,
                           std::vector<std::string> namespaces, FastPathServer* fast_path, TenantRegistry* tenants,
                           IdleStreams* idle_puts)
    : store_(store),
      executor_(executor),
      metrics_(metrics),
      fast_path_(fast_path),
      tenants_(tenants),
      idle_puts_(idle_puts),
      planner_(std::move(namespaces), fast_path) {}

absl::StatusOr<std::shared_ptr<const Caller>> CacheService::Authenticate(const grpc::CallbackServerContext& context,
                                                                         const char* method) const {
  absl::StatusOr<std::shared_ptr<const Caller>> caller = kvtier::Authenticate(tenants_, context, method);
  if (!caller.ok()) (void)Count("", caller.status());
  return caller;
}

absl::Status CacheService::Count(const std::string& tenant, absl::Status status) const {
  if (metrics_ != nullptr && !status.ok()) metrics_->CountDenied(tenant, status);
  return status;
}

GetAnswer CacheService::ReadForGet(const GetPlan& plan, size_t index) const {
  GetAnswer answer;
  absl::StatusOr<std::shared_ptr<const PinnedBlock>> block =
      store_->Read(plan.scope.ns, plan.scope.layout_id, plan.hashes[index]);
  if (!block.ok()) {
    answer.miss = block.status();
    return answer;
  }
  answer.tier = static_cast<v1::Tier>((*block)->tier());
  if (plan.layer_count == plan.scope.layout.num_layers) {
    answer.record = *std::move(block);
    return answer;
  }
  // Only the layers asked for: a record of its own, with its own CRC. The
  // store checked this one's as it read it.
  const std::string record = (*block)->CopyToString();
  absl::StatusOr<kvblock::BlockView> view =
      kvblock::ParseBlock(record, &plan.scope.layout, kvblock::CrcCheck::kCheckedBefore);
  if (!view.ok()) {
    answer.miss = view.status();
    return answer;
  }
  const size_t per_layer = view->header.layer_payload_bytes;
  absl::StatusOr<std::string> subset = kvblock::SerializeBlock(
      kvblock::HeaderFor(plan.scope.layout, plan.layer_begin, plan.layer_count),
      view->payloads.substr(size_t{plan.layer_begin} * per_layer, size_t{plan.layer_count} * per_layer));
  if (subset.ok()) {
    answer.subset = *std::move(subset);
  } else {
    answer.miss = subset.status();
  }
  return answer;
}

grpc::ServerUnaryReactor* CacheService::Match(grpc::CallbackServerContext* context, const v1::MatchRequest* request,
                                              v1::MatchResponse* response) {
  RpcTimer timer(metrics_, "Match");
  absl::StatusOr<std::shared_ptr<const Caller>> caller = Authenticate(*context, "Match");
  if (!caller.ok()) return FinishUnary(context, std::move(timer), caller.status());
  const std::string tenant = (*caller)->tenant;
  absl::StatusOr<BlocksPlan> plan = planner_.PlanMatch(*std::move(caller), *request);
  if (!plan.ok()) return FinishUnary(context, std::move(timer), Count(tenant, plan.status()));
  MatchResult m = store_->Match(plan->scope.ns, plan->scope.layout_id, plan->hashes, plan->lease_ttl, tenant,
                                plan->scope.caller->quota.max_leases());
  if (!m.lease_status.ok()) return FinishUnary(context, std::move(timer), Count(tenant, m.lease_status));
  if (metrics_ != nullptr) metrics_->CountMatch(tenant, m.matched_blocks, plan->hashes.size());
  response->set_matched_blocks(m.matched_blocks);
  for (TierKind t : m.tiers) response->add_tiers(static_cast<v1::Tier>(t));
  if (m.lease_id != 0) {
    response->set_lease_id(m.lease_id);
    response->set_lease_deadline_unix_ms(absl::ToUnixMillis(m.lease_deadline));
  }
  return FinishUnary(context, std::move(timer), absl::OkStatus());
}

grpc::ServerReadReactor<grpc::ByteBuffer>* CacheService::Put(grpc::CallbackServerContext* context,
                                                             grpc::ByteBuffer* response) {
  return new PutReactor(this, Authenticate(*context, "Put"), response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CacheService::Get(grpc::CallbackServerContext* context,
                                                              const grpc::ByteBuffer* request) {
  return new GetReactor(this, Authenticate(*context, "Get"), request);
}

grpc::ServerUnaryReactor* CacheService::ReleaseLease(grpc::CallbackServerContext* context,
                                                     const v1::ReleaseLeaseRequest* request,
                                                     v1::ReleaseLeaseResponse*) {
  RpcTimer timer(metrics_, "ReleaseLease");
  absl::StatusOr<std::shared_ptr<const Caller>> caller = Authenticate(*context, "ReleaseLease");
  if (!caller.ok()) return FinishUnary(context, std::move(timer), caller.status());
  const uint64_t id = request->lease_id();
  absl::Status status = fast_path_ != nullptr && (id & kFastPathLeaseBit) != 0
                            ? fast_path_->Release(id, (*caller)->SessionOwner())
                            : store_->ReleaseLease(id, (*caller)->tenant);
  return FinishUnary(context, std::move(timer), status);
}

grpc::ServerUnaryReactor* CacheService::Stats(grpc::CallbackServerContext* context, const v1::StatsRequest*,
                                              v1::StatsResponse* response) {
  RpcTimer timer(metrics_, "Stats");
  absl::StatusOr<std::shared_ptr<const Caller>> caller = Authenticate(*context, "Stats");
  if (!caller.ok()) return FinishUnary(context, std::move(timer), caller.status());
  const StoreStats stats = store_->Stats();
  if ((*caller)->role != v1::ADMIN && tenants_ != nullptr) {
    FillTenantStats(stats, **caller, *response);
    return FinishUnary(context, std::move(timer), absl::OkStatus());
  }
  FillStats(stats, fast_path_ != nullptr ? fast_path_->Counters() : FastPathCounters(), *response);
  return FinishUnary(context, std::move(timer), absl::OkStatus());
}

grpc::ServerUnaryReactor* CacheService::OpenFastPath(grpc::CallbackServerContext* context,
                                                     const v1::OpenFastPathRequest* request,
                                                     v1::OpenFastPathResponse* response) {
  RpcTimer timer(metrics_, "OpenFastPath");
  if (fast_path_ == nullptr) return FinishUnary(context, std::move(timer), NoFastPath());
  absl::StatusOr<std::shared_ptr<const Caller>> caller = Authenticate(*context, "OpenFastPath");
  if (!caller.ok()) return FinishUnary(context, std::move(timer), caller.status());
  absl::StatusOr<v1::OpenFastPathResponse> opened = fast_path_->Open(*request, **caller);
  if (!opened.ok()) return FinishUnary(context, std::move(timer), Count((*caller)->tenant, opened.status()));
  *response = *std::move(opened);
  return FinishUnary(context, std::move(timer), absl::OkStatus());
}

grpc::ServerUnaryReactor* CacheService::LeaseBlocks(grpc::CallbackServerContext* context,
                                                    const v1::LeaseBlocksRequest* request,
                                                    v1::LeaseBlocksResponse* response) {
  RpcTimer timer(metrics_, "LeaseBlocks");
  absl::StatusOr<std::shared_ptr<const Caller>> caller = Authenticate(*context, "LeaseBlocks");
  if (!caller.ok()) return FinishUnary(context, std::move(timer), caller.status());
  const std::string tenant = (*caller)->tenant;
  absl::StatusOr<BlocksPlan> plan = planner_.PlanLease(*std::move(caller), *request);
  if (!plan.ok()) return FinishUnary(context, std::move(timer), Count(tenant, plan.status()));
  // Pinning may promote blocks (a copy between tiers): not on a gRPC thread.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto work = [this, reactor, request, response, plan = *std::move(plan), timer]() mutable {
    const absl::Status status =
        fast_path_->Lease(request->session_id(), plan.scope.ns, plan.scope.layout_id, plan.hashes, *plan.lease_ttl,
                          *response, plan.scope.caller->SessionOwner());
    const grpc::Status g = ToGrpcStatus(status);
    timer.Done(g.error_code());
    reactor->Finish(g);
  };
  if (!executor_->TrySubmit(std::move(work))) {
    timer.Done(kBusy.error_code());
    reactor->Finish(kBusy);
  }
  return reactor;
}

}  // namespace kvtier::cache
