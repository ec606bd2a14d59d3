#include "services/prefill/prefill_service.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "services/base/address.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/rpc/caller.h"
#include "services/rpc/client_identity.h"
#include "services/rpc/grpc_status.h"
#include "services/serving/generated_tokens.h"
#include "services/serving/model_server.h"
#include "services/serving/request_checks.h"
#include "services/serving/sequence_blocks.h"

namespace kvtier::prefill {

PrefillService::PrefillService(const runtime::Model* model, std::string model_id, cache::ShardSet* shards,
                               prometheus::Registry* registry, PrefillOptions options)
    : model_(*model),
      model_id_(std::move(model_id)),
      shards_(*shards),
      options_(options),
      layout_(serving::ModelLayout(model->config(), model_id_, options.codec, options.tokens_per_block)),
      decoders_(std::make_shared<Decoders>()),
      requests_(prometheus::BuildCounter()
                    .Name("kvtier_prefill_requests_total")
                    .Help("Generate requests, by final gRPC status code.")
                    .Register(*registry)),
      prompt_tokens_(prometheus::BuildCounter()
                         .Name("kvtier_prefill_prompt_tokens_total")
                         .Help("Prompt tokens received.")
                         .Register(*registry)
                         .Add({})),
      cached_tokens_(prometheus::BuildCounter()
                         .Name("kvtier_prefill_cached_tokens_total")
                         .Help("Prompt tokens whose latents came from the cache instead of prefill.")
                         .Register(*registry)
                         .Add({})),
      blocks_inline_(prometheus::BuildCounter()
                         .Name("kvtier_prefill_blocks_inline_total")
                         .Help("New blocks sent to the decode worker inline because the cache did not store them.")
                         .Register(*registry)
                         .Add({})),
      time_to_first_token_(prometheus::BuildHistogram()
                               .Name("kvtier_prefill_time_to_first_token_seconds")
                               .Help("From request arrival to the first token sent.")
                               .Register(*registry)
                               .Add({}, prometheus::Histogram::BucketBoundaries{0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                                                0.5, 1, 2.5, 5, 10, 30})),
      stalls_(options.decode_idle),
      prefilling_(std::make_unique<Executor>(options.max_concurrent_prefills, kMaxQueuedPrefills)),
      per_tenant_(options.max_generations_per_tenant, "generations of tenant", "--max-generations-per-tenant"),
      per_client_(options.max_generations_per_client, "generations from", "--max-generations-per-client") {}

PrefillService::~PrefillService() { prefilling_.reset(); }

void PrefillService::SetDecoders(const std::vector<std::string>& targets) {
  absl::MutexLock lock(&decoders_mu_);
  auto next = std::make_shared<Decoders>();
  for (const std::string& target : targets) {
    auto kept = std::find_if(decoders_->begin(), decoders_->end(), [&](const auto& d) { return d.first == target; });
    next->emplace_back(target, kept != decoders_->end()
                                   ? kept->second
                                   : std::shared_ptr<v1::Decode::Stub>(v1::Decode::NewStub(MakeChannel(target))));
  }
  decoders_ = std::move(next);
}

std::pair<std::shared_ptr<const Decoders>, size_t> PrefillService::PickDecoders() {
  absl::MutexLock lock(&decoders_mu_);
  return {decoders_, next_decoder_.fetch_add(1)};
}

grpc::ServerUnaryReactor* PrefillService::Info(grpc::CallbackServerContext* context, const v1::InfoRequest* /*request*/,
                                               v1::ServerInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::shared_ptr<const Caller>> caller = CallerOf(*context);
  if (caller.ok()) {
    *response = serving::ServerInfoFor("kvtier-prefill", model_, model_id_, {layout_}, (*caller)->default_namespace);
  }
  reactor->Finish(ToGrpcStatus(caller.status()));
  return reactor;
}

// One Generate call. Prefill runs on the executor; then the first token is
// written, and the rest relayed from a decode worker's stream (DecodeCall),
// one event at a time: a token is read from the worker only once the one
// before it is written to the client, so neither side buffers without
// bound. If a worker fails, the next continues from the last token the
// client has. Each step's next move is decided under mu_ and done outside
// it (StartWrite, Finish and the decode call's own calls may run reactions
// inline). It owns itself from its start to OnDone; its decode calls hold
// it too.
class PrefillService::Stream final : public grpc::ServerWriteReactor<v1::GenerateResponse>,
                                     public std::enable_shared_from_this<Stream> {
 public:
  static Stream* Start(PrefillService* service, grpc::CallbackServerContext* context,
                       const v1::GenerateRequest* request) {
    std::shared_ptr<Stream> stream(new Stream(service, context, request));
    stream->self_ = stream;
    stream->Begin();
    return stream.get();
  }

  void OnWriteDone(bool ok) override;
  void OnCancel() override { Stop(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled")); }
  void OnDone() override;

  // From the current DecodeCall: an event it read, and its end.
  void OnDecodeEvent(DecodeCall& call, const v1::DecodeResponse& event);
  void OnDecodeDone(DecodeCall& call, const grpc::Status& status, bool stalled);

 private:
  // What follows the write under way.
  enum class AfterWrite { kFirstToken, kRelayed, kFinished };

  Stream(PrefillService* service, grpc::CallbackServerContext* context, const v1::GenerateRequest* request)
      : service_(service), context_(context), request_(request), start_(absl::Now()) {}

  void Begin();
  void Prefill();  // on the executor
  // Opens a stream on the next decode worker, or ends the call if none is
  // left; starting_ is set, and holds off the call's end meanwhile.
  void NextAttempt();
  // Asks the decode call for its next event, or advances if it was let go.
  void ReadNext();
  // Lets go of the decode call, cancelled.
  void DropCall();
  // Concludes when a stop, an error or the end is due and no write or
  // prefill is under way.
  void Advance();
  void Stop(grpc::Status why);
  void Write(v1::GenerateResponse message, AfterWrite after);
  void Conclude(const grpc::Status& status);
  // Whether the client may still have the generation: a generation
  // outlives the check its call got as it began, so once a reload puts
  // other TLS files or another tenants file in force, a client revoked, a
  // tenant removed or taken off the namespace gets no more tokens.
  absl::Status FollowCaller();

  PrefillService* const service_;
  grpc::CallbackServerContext* const context_;  // gRPC's, until OnDone
  const v1::GenerateRequest* const request_;    // gRPC's, until Finish
  const absl::Time start_;
  std::shared_ptr<Stream> self_;  // from Start to OnDone
  // Set before the prefill, read after it.
  std::shared_ptr<const Caller> caller_;
  FollowedCaller followed_;                   // by OnWriteDone, one write at a time
  std::vector<std::shared_ptr<void>> holds_;  // places in the service's bounds, until OnDone
  std::string ns_;
  v1::DecodeRequest decode_;
  v1::Usage usage_;
  // The decode workers as the relay began, where it began, and how far.
  std::shared_ptr<const Decoders> decoders_;
  size_t first_decoder_ = 0;
  size_t attempts_ = 0;

  absl::Mutex mu_;
  std::string failures_ ABSL_GUARDED_BY(mu_);  // of the workers tried, for the final error
  v1::GenerateResponse out_;                   // the message being written; only while writing_
  bool preparing_ ABSL_GUARDED_BY(mu_) = false;
  bool starting_ ABSL_GUARDED_BY(mu_) = false;  // a decode call is being opened
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  AfterWrite after_ ABSL_GUARDED_BY(mu_) = AfterWrite::kFirstToken;
  std::shared_ptr<DecodeCall> call_ ABSL_GUARDED_BY(mu_);  // the worker streaming now
  bool holding_ ABSL_GUARDED_BY(mu_) = false;              // call_ waits for ReadNext or Release
  bool finished_ ABSL_GUARDED_BY(mu_) = false;             // the worker's finish arrived
  uint32_t next_index_ ABSL_GUARDED_BY(mu_) = 1;           // the next token the client has not seen
  std::optional<grpc::Status> stop_ ABSL_GUARDED_BY(mu_);  // the client went away
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);   // how the call ends, once known
  bool concluded_ ABSL_GUARDED_BY(mu_) = false;
};

// One decode worker's stream of a Stream's sequence. Cancellation and the
// deadline of the client's call carry over; a worker that sends nothing
// for --decode-idle-ms is cancelled by the service's StallWatch. It owns
// itself from Start to OnDone.
class PrefillService::DecodeCall final : public grpc::ClientReadReactor<v1::DecodeResponse> {
 public:
  // A call of `stream`'s; it starts on Go.
  static std::shared_ptr<DecodeCall> Create(std::shared_ptr<Stream> stream, std::string target, v1::Decode::Stub& stub,
                                            const grpc::CallbackServerContext& server_context,
                                            const v1::DecodeRequest& request, const std::string& acting_for,
                                            StallWatch& stalls) {
    std::shared_ptr<DecodeCall> call(new DecodeCall(std::move(stream), std::move(target)));
    call->self_ = call;
    // The client's deadline carries over; its cancellation does too, by
    // OnCancel's Stop. Not gRPC's inherited cancellation: it also fires when
    // the client's call ends well, which can come before the worker's OK
    // status that follows the finish, and the worker would count a whole
    // generation as cancelled.
    call->context_ = grpc::ClientContext::FromCallbackServerContext(
        server_context, grpc::PropagationOptions().disable_cancellation_propagation());
    if (!acting_for.empty()) call->context_->AddMetadata(kActingForMetadata, acting_for);
    call->watched_ = stalls.Watch(call, call->context_.get());
    stub.async()->Decode(call->context_.get(), &request, call.get());
    return call;
  }
  void Go() {
    StartRead(&event_);
    StartCall();
  }

  const std::string& target() const { return target_; }
  // Not once the worker's finish has arrived: the call ends by itself, its
  // OK on the way, and cancelled the worker would count a whole generation
  // as cancelled.
  void Cancel() {
    if (!finished_.load()) context_->TryCancel();
  }
  // After an event other than the finish, the call holds (no OnDone) until
  // the stream answers with exactly one of these: read the next event, or
  // let go (cancelled).
  void ReadNext() {
    StartRead(&event_);
    RemoveHold();
  }
  void Release(bool cancel) {
    if (cancel) Cancel();
    RemoveHold();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream's end: OnDone follows
    watched_->Progress();
    if (!event_.has_finished()) {
      AddHold();
      return stream_->OnDecodeEvent(*this, event_);
    }
    finished_.store(true);
    const v1::DecodeResponse finished = std::move(event_);
    StartRead(&event_);  // to its end, for OnDone
    stream_->OnDecodeEvent(*this, finished);
  }
  void OnDone(const grpc::Status& status) override {
    watched_->Stop();
    stream_->OnDecodeDone(*this, status, watched_->fired());
    self_.reset();  // may delete this
  }

 private:
  DecodeCall(std::shared_ptr<Stream> stream, std::string target)
      : stream_(std::move(stream)), target_(std::move(target)) {}

  const std::shared_ptr<Stream> stream_;
  const std::string target_;
  std::shared_ptr<DecodeCall> self_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::shared_ptr<StallWatch::Watched> watched_;
  v1::DecodeResponse event_;
  std::atomic<bool> finished_{false};  // the worker's finish arrived
};

void PrefillService::Stream::Begin() {
  const runtime::ModelConfig& c = service_->model_.config();
  absl::StatusOr<std::shared_ptr<const Caller>> caller = CallerOf(*context_);
  if (!caller.ok()) return Conclude(ToGrpcStatus(caller.status()));
  const v1::GenerateRequest& r = *request_;
  ns_ = r.kv_namespace().empty() ? (*caller)->default_namespace : r.kv_namespace();
  absl::Status valid = serving::CheckRequestScope(r.request_id(), ns_, **caller);
  if (valid.ok()) valid = serving::CheckTokenIds(r.prompt_token_ids(), c.vocab_size, "prompt_token_ids");
  if (valid.ok()) {
    valid = serving::CheckGeneration(c, r.prompt_token_ids_size(), r.sampling(), r.limits(),
                                     service_->options_.max_top_logprobs);
  }
  if (!valid.ok()) return Conclude(ToGrpcStatus(valid));
  caller_ = *std::move(caller);
  // Places held until OnDone, so that one tenant or client cannot take
  // every generation (and decode worker sequence) there is.
  absl::StatusOr<std::shared_ptr<void>> client = service_->per_client_.Hold(PeerHost(context_->peer()));
  if (!client.ok()) return Conclude(ToGrpcStatus(client.status()));
  holds_.push_back(*std::move(client));
  if (!caller_->tenant.empty()) {
    absl::StatusOr<std::shared_ptr<void>> tenant = service_->per_tenant_.Hold(caller_->tenant);
    if (!tenant.ok()) {
      holds_.clear();  // now: the client may call again before OnDone
      return Conclude(ToGrpcStatus(tenant.status()));
    }
    holds_.push_back(*std::move(tenant));
  }
  {
    absl::MutexLock lock(&mu_);
    preparing_ = true;
  }
  if (!service_->prefilling_->TrySubmit([self = shared_from_this()] { self->Prefill(); })) {
    Conclude(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "the prefill node has as many requests waiting for their prefill as it may hold"));
  }
}

void PrefillService::Stream::Prefill() {
  absl::StatusOr<Prefilled> p = service_->Prefill(*request_, ns_, *caller_);
  if (!p.ok()) return Conclude(ToGrpcStatus(p.status()));
  service_->prompt_tokens_.Increment(request_->prompt_token_ids_size());
  service_->cached_tokens_.Increment(p->cached_tokens);
  decode_ = std::move(p->decode);
  usage_.set_prompt_tokens(static_cast<uint32_t>(request_->prompt_token_ids_size()));
  usage_.set_cached_tokens(p->cached_tokens);
  {
    absl::MutexLock lock(&mu_);
    preparing_ = false;
  }
  v1::GenerateResponse first;
  *first.mutable_token() = decode_.first_token();
  Write(std::move(first), AfterWrite::kFirstToken);
}

void PrefillService::Stream::Write(v1::GenerateResponse message, AfterWrite after) {
  bool write = false;
  {
    absl::MutexLock lock(&mu_);
    if (!concluded_ && !stop_.has_value()) {
      out_ = std::move(message);
      after_ = after;
      writing_ = write = true;
    }
  }
  if (write) return StartWrite(&out_);
  Advance();
}

void PrefillService::Stream::OnWriteDone(bool ok) {
  AfterWrite after;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    after = after_;
  }
  if (!ok) return Stop(grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading"));
  switch (after) {
    case AfterWrite::kFirstToken: {
      const absl::Duration ttft = absl::Now() - start_;
      service_->time_to_first_token_.Observe(absl::ToDoubleSeconds(ttft));
      usage_.set_time_to_first_token_us(static_cast<uint64_t>(absl::ToInt64Microseconds(ttft)));
      if (const v1::FinishReason reason = serving::FinishAfter(0, decode_.first_token().token_id(), request_->limits());
          reason != v1::FINISH_REASON_UNSPECIFIED) {  // token 0 was the whole generation
        v1::GenerateResponse done;
        done.mutable_finished()->set_reason(reason);
        usage_.set_generated_tokens(1);
        *done.mutable_finished()->mutable_usage() = usage_;
        return Write(std::move(done), AfterWrite::kFinished);
      }
      std::tie(decoders_, first_decoder_) = service_->PickDecoders();
      {
        absl::MutexLock lock(&mu_);
        starting_ = true;
      }
      return NextAttempt();
    }
    case AfterWrite::kRelayed:
      if (absl::Status allowed = FollowCaller(); !allowed.ok()) return Stop(ToGrpcStatus(allowed));
      return ReadNext();
    case AfterWrite::kFinished: {
      {
        absl::MutexLock lock(&mu_);
        if (!end_.has_value()) end_ = grpc::Status::OK;
      }
      return Advance();
    }
  }
}

absl::Status PrefillService::Stream::FollowCaller() {
  KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<const Caller> now, followed_.Now(*context_));
  return now == caller_ ? absl::OkStatus() : serving::CheckRequestScope(request_->request_id(), ns_, *now);
}

void PrefillService::Stream::ReadNext() {
  std::shared_ptr<DecodeCall> call;
  {
    absl::MutexLock lock(&mu_);
    if (holding_) call = call_;
    holding_ = false;
  }
  if (call == nullptr) return Advance();  // let go meanwhile (a stop)
  call->ReadNext();
}

void PrefillService::Stream::NextAttempt() {
  std::optional<grpc::Status> end;
  if (context_->IsCancelled()) {  // valid: starting_ holds off the call's end
    end = grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled");
  } else if (decoders_ == nullptr || decoders_->empty()) {
    end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "no decode worker is known");
  } else if (attempts_ >= decoders_->size()) {
    absl::MutexLock lock(&mu_);
    end = grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("no decode worker could continue the request after token ", next_index_ - 1, ": ", failures_));
  } else {
    const auto& [target, stub] = (*decoders_)[(first_decoder_ + attempts_++) % decoders_->size()];
    std::shared_ptr<DecodeCall> call = DecodeCall::Create(shared_from_this(), target, *stub, *context_, decode_,
                                                          caller_->ActingFor(), service_->stalls_);
    bool stopped;
    {
      absl::MutexLock lock(&mu_);
      call_ = call;  // before it starts: its reactions may run at once
      stopped = stop_.has_value();
    }
    call->Go();
    if (stopped) call->Cancel();
  }
  {
    absl::MutexLock lock(&mu_);
    starting_ = false;
    if (end.has_value() && !end_.has_value()) end_ = std::move(end);
  }
  Advance();
}

void PrefillService::Stream::OnDecodeEvent(DecodeCall& call, const v1::DecodeResponse& event) {
  v1::GenerateResponse out;
  AfterWrite after = AfterWrite::kRelayed;
  enum { kWrite, kSkip, kBroken, kStale } next = kWrite;
  {
    absl::MutexLock lock(&mu_);
    if (&call != call_.get() || concluded_) {
      next = kStale;
    } else if (event.has_token()) {
      holding_ = true;
      // A retried worker repeats what an earlier one already streamed
      // (sampling depends only on seed and index): skip those.
      if (event.token().index() < next_index_) {
        next = kSkip;
      } else if (event.token().index() != next_index_) {
        end_ = grpc::Status(grpc::StatusCode::INTERNAL,
                            absl::StrCat("decode worker ", call.target(), " skipped from token ", next_index_, " to ",
                                         event.token().index()));
        next = kBroken;
      } else {
        ++next_index_;
        *out.mutable_token() = event.token();
      }
    } else if (event.has_finished()) {
      finished_ = true;
      usage_.set_generated_tokens(event.finished().usage().generated_tokens());
      out.mutable_finished()->set_reason(event.finished().reason());
      *out.mutable_finished()->mutable_usage() = usage_;
      after = AfterWrite::kFinished;
    } else {
      holding_ = true;
      next = kSkip;
    }
  }
  switch (next) {
    case kWrite:
      return Write(std::move(out), after);
    case kSkip:
      return ReadNext();
    case kBroken:
      DropCall();
      return Advance();
    case kStale:
      if (!event.has_finished()) call.Release(/*cancel=*/true);
      return;
  }
}

void PrefillService::Stream::OnDecodeDone(DecodeCall& call, const grpc::Status& status, bool stalled) {
  // Another worker can take over from where this one stopped only for
  // faults of the worker itself, not for a request it rejected: one that
  // is not a decode worker at all (UNIMPLEMENTED: discovery named some
  // other server) is such a fault.
  const bool retryable = stalled || status.ok() || status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                         status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                         status.error_code() == grpc::StatusCode::UNIMPLEMENTED;
  const std::string why = stalled
                              ? absl::StrCat("no progress for ", absl::FormatDuration(service_->options_.decode_idle))
                          : status.ok() ? "stream ended without a finish"
                                        : status.error_message();
  bool retry = false;
  uint32_t last = 0;
  {
    absl::MutexLock lock(&mu_);
    if (&call == call_.get() && !concluded_ && !finished_ && !end_.has_value() && !stop_.has_value()) {
      absl::StrAppend(&failures_, failures_.empty() ? "" : "; ", call.target(), ": ", why);
      if (retryable) {
        retry = starting_ = true;
        last = next_index_ - 1;
      } else {
        end_ = grpc::Status(status.error_code(), absl::StrCat("decode worker ", call.target(), ": ", why));
      }
    }
  }
  if (!retry) return Advance();
  Log(LogLevel::kWarning, "request",
      absl::StrCat("'", absl::CEscape(decode_.request_id()), "': decode worker ", call.target(), " failed after token ",
                   last, " (", why, ")", attempts_ < decoders_->size() ? "; trying the next" : ""));
  NextAttempt();
}

void PrefillService::Stream::Stop(grpc::Status why) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_.has_value()) stop_ = std::move(why);
  }
  DropCall();
  Advance();
}

void PrefillService::Stream::DropCall() {
  std::shared_ptr<DecodeCall> call;
  bool holding;
  {
    absl::MutexLock lock(&mu_);
    call = call_;
    holding = std::exchange(holding_, false);
  }
  if (call == nullptr) return;
  if (holding) {
    call->Release(/*cancel=*/true);
  } else {
    call->Cancel();
  }
}

void PrefillService::Stream::Advance() {
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    if (concluded_ || writing_ || preparing_ || starting_) return;
    if (stop_.has_value()) {
      finish = *stop_;
    } else if (end_.has_value()) {
      finish = *end_;
    }
  }
  if (finish.has_value()) Conclude(*finish);
}

void PrefillService::Stream::Conclude(const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (concluded_) return;
    concluded_ = true;
  }
  DropCall();
  service_->requests_.Add({{"code", StatusCodeName(status.error_code())}}).Increment();
  Finish(status);
}

void PrefillService::Stream::OnDone() {
  holds_.clear();
  {
    absl::MutexLock lock(&mu_);
    call_.reset();  // a call still ending holds this object, not the RPC
  }
  self_.reset();  // may delete this
}

grpc::ServerWriteReactor<v1::GenerateResponse>* PrefillService::Generate(grpc::CallbackServerContext* context,
                                                                         const v1::GenerateRequest* request) {
  return Stream::Start(this, context, request);
}

}  // namespace kvtier::prefill
