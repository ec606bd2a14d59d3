#include "services/decode/decode_service.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/rpc/caller.h"
#include "services/rpc/grpc_status.h"
#include "services/serving/generated_tokens.h"
#include "services/serving/model_server.h"
#include "services/serving/request_checks.h"
#include "services/serving/sequence_blocks.h"
#include "services/serving/v4_records.h"

namespace kvtier::decode {
namespace {

prometheus::Counter& MakeCounter(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

// Whom a decode worker serves: a SERVICE, or one acting for a tenant;
// everyone without a tenants file (one trust domain). Not an ADMIN calling
// for itself: decode workers serve prefill nodes only.
absl::Status CheckServed(const Caller& caller) {
  if (caller.role != v1::SERVICE && caller.service.empty() && !caller.tenant.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(caller.Describe(),
                                                    " is not a kvtier service: decode workers serve only prefill "
                                                    "nodes (send requests to a prefill node)"));
  }
  return absl::OkStatus();
}

}  // namespace

DecodeService::DecodeService(const runtime::Model* model, std::string model_id, cache::ShardSet* shards,
                             prometheus::Registry* registry, Batcher::Options options,
                             uint64_t max_sequences_per_tenant)
    : model_(*model),
      model_id_(std::move(model_id)),
      shards_(*shards),
      writer_(*shards, /*max_queued=*/4096),
      requests_(prometheus::BuildCounter()
                    .Name("kvtier_decode_requests_total")
                    .Help("Decode requests, by final gRPC status code (named as the cache's).")
                    .Register(*registry)),
      tokens_(MakeCounter(*registry, "kvtier_decode_tokens_total", "Tokens generated and streamed.")),
      blocks_fetched_(
          MakeCounter(*registry, "kvtier_decode_blocks_fetched_total", "Prompt blocks read from the cache shards.")),
      blocks_inline_(
          MakeCounter(*registry, "kvtier_decode_blocks_inline_total", "Prompt blocks that came inside the request.")),
      blocks_recomputed_(MakeCounter(*registry, "kvtier_decode_blocks_recomputed_total",
                                     "Prompt blocks the cache could not supply, recomputed here.")),
      blocks_written_back_(MakeCounter(*registry, "kvtier_decode_blocks_written_back_total",
                                       "Blocks filled during decode and queued for the cache.")),
      batch_size_(prometheus::BuildHistogram()
                      .Name("kvtier_decode_batch_size")
                      .Help("Sequences per decode step.")
                      .Register(*registry)
                      .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128})),
      step_seconds_(prometheus::BuildHistogram()
                        .Name("kvtier_decode_step_duration_seconds")
                        .Help("Wall time of one decode step of the whole batch.")
                        .Register(*registry)
                        .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                                         0.25, 0.5, 1, 2.5})),
      sequences_(prometheus::BuildGauge()
                     .Name("kvtier_decode_sequences")
                     .Help("Decode streams open: sequences being decoded or waiting for their turn.")
                     .Register(*registry)
                     .Add({})),
      batcher_(std::make_unique<Batcher>(
          model_, options, [this](DecodeSequence& s, size_t block) { OnSealed(s, block); },
          [this](DecodeSequence& s) { OnEnding(s); },
          [this](size_t batch, double seconds) {
            batch_size_.Observe(static_cast<double>(batch));
            step_seconds_.Observe(seconds);
          })),
      preparing_(std::make_unique<Executor>(kPreparingThreads, options.max_sequences)),
      per_tenant_(
          max_sequences_per_tenant > 0 ? max_sequences_per_tenant : std::max<uint64_t>(options.max_sequences / 2, 1),
          "sequences of tenant", "--max-sequences-per-tenant") {}

DecodeService::~DecodeService() {
  preparing_.reset();
  batcher_.reset();
}

absl::StatusOr<std::shared_ptr<DecodeSequence>> DecodeService::Prepare(const v1::DecodeRequest& r,
                                                                       const Caller& caller) {
  // An end tenant's blocks are fetched and written back as its; a reader's
  // generation stores nothing.
  const std::string acting_for = caller.service.empty() ? "" : caller.tenant;
  const bool write_back = !r.skip_write_back() && caller.MayWrite();
  const runtime::ModelConfig& c = model_.config();
  KVTIER_ASSIGN_OR_RETURN(kvblock::LatentLayout layout, kvblock::LayoutFromProto(r.layout()));
  if (!(layout == serving::ModelLayout(c, model_id_, layout.codec, layout.tokens_per_block))) {
    return absl::FailedPreconditionError(
        absl::StrCat("the request's latents are of model ", layout.model_id, " (", layout.num_layers, " layers, ",
                     layout.kv_lora_rank, "+", layout.rope_dim, "); this worker serves ", model_id_, " (",
                     c.num_hidden_layers, " layers, ", c.kv_lora_rank, "+", c.qk_rope_head_dim, ")"));
  }
  KVTIER_RETURN_IF_ERROR(serving::CheckTokenIds(r.token_ids(), c.vocab_size, "token_ids"));
  KVTIER_RETURN_IF_ERROR(serving::CheckGeneration(
      c, r.token_ids_size(), r.sampling(), r.limits(),
      /*the prefill node holds callers to its --max-top-logprobs*/ static_cast<uint32_t>(c.vocab_size)));
  if (r.first_token().index() != 0 || r.first_token().token_id() >= c.vocab_size) {
    return absl::InvalidArgumentError("first_token must be generated index 0 and inside the vocabulary");
  }
  const std::vector<uint32_t> tokens(r.token_ids().begin(), r.token_ids().end());
  const size_t tpb = layout.tokens_per_block, full = tokens.size() / tpb;
  std::vector<kvblock::BlockHash> chain =
      kvblock::ComputeBlockChain(r.kv_namespace(), kvblock::LayoutId(layout), layout.tokens_per_block, tokens);
  if (static_cast<size_t>(r.block_hashes_size()) != full) {
    return absl::InvalidArgumentError(absl::StrCat("block_hashes has ", r.block_hashes_size(), " hashes; ",
                                                   tokens.size(), " tokens make ", full, " full blocks"));
  }
  for (size_t i = 0; i < full; ++i) {
    if (r.block_hashes(static_cast<int>(i)) != kvblock::HashAsBytes(chain[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("block_hashes[", i, "] is not the chain hash of its tokens in this namespace and layout"));
    }
  }
  std::vector<const std::string*> inline_records(full, nullptr);  // by block index
  for (const v1::InlineBlock& b : r.inline_blocks()) {
    if (b.block_index() >= full || inline_records[b.block_index()] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("inline block index ", b.block_index(),
                                                     " is repeated or not one of the ", full, " full blocks"));
    }
    inline_records[b.block_index()] = &b.data();
  }
  auto s = std::make_shared<DecodeSequence>();
  s->cache = model_.NewCache(layout.codec, layout.tokens_per_block);
  s->tokens = tokens;
  s->write_back = write_back;
  s->acting_for = acting_for;
  s->ns = r.kv_namespace();
  s->layout = layout;
  s->chain = std::move(chain);
  KVTIER_RETURN_IF_ERROR(layout.IsV4() ? LoadV4(r, inline_records, *s) : LoadMla(r, inline_records, *s));
  s->next_input = r.first_token().token_id();
  s->next_index = 1;
  s->sampling = serving::ToSampling(r.sampling());
  s->limits = r.limits();
  return s;
}

std::vector<absl::StatusOr<cache::SharedRecord>> DecodeService::FetchBlocks(
    const DecodeSequence& s, size_t count, std::span<const std::string* const> inline_records) {
  std::vector<kvblock::BlockHash> wanted;
  std::vector<size_t> wanted_index;
  for (size_t i = 0; i < count; ++i) {
    if (inline_records[i] == nullptr) wanted.push_back(s.chain[i]), wanted_index.push_back(i);
  }
  std::vector<absl::StatusOr<cache::SharedRecord>> fetched = shards_.Fetch(s.ns, s.layout, wanted, s.acting_for);
  std::vector<absl::StatusOr<cache::SharedRecord>> out(count, absl::NotFoundError("inline"));
  for (size_t k = 0; k < wanted.size(); ++k) out[wanted_index[k]] = std::move(fetched[k]);
  return out;
}

bool DecodeService::WriteBack(DecodeSequence& s, const kvblock::BlockHash& key, absl::StatusOr<std::string> record,
                              const std::optional<kvblock::BlockHash>& shard_key) {
  if (!s.write_back || !record.ok()) return false;
  const uint64_t ticket = writer_.Enqueue(s.ns, s.layout, key, *std::move(record), s.acting_for, shard_key);
  if (ticket == 0) return false;
  s.last_write = ticket;
  return true;
}

absl::Status DecodeService::LoadMla(const v1::DecodeRequest& r, std::span<const std::string* const> inline_records,
                                    DecodeSequence& s) {
  const size_t tpb = s.layout.tokens_per_block, full = inline_records.size();
  if (r.tail().token_count() != s.tokens.size() % tpb) {
    return absl::InvalidArgumentError(absl::StrCat("tail.token_count must be ", s.tokens.size() % tpb));
  }
  if (!r.restore_point().empty()) return absl::InvalidArgumentError("restore_point is for DeepSeek-V4 layouts only");
  std::vector<absl::StatusOr<cache::SharedRecord>> fetched = FetchBlocks(s, full, inline_records);
  size_t recomputed = 0;
  std::vector<float> scratch(model_.config().vocab_size);
  for (size_t i = 0; i < full; ++i) {
    if (inline_records[i] != nullptr) {
      if (absl::Status st =
              serving::AppendBlockRecord(std::make_shared<const std::string>(*inline_records[i]), s.layout, s.cache);
          !st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("inline block ", i, ": ", st.message()));
      }
      blocks_inline_.Increment();
      continue;
    }
    // Fetch checked each record's CRC as it landed.
    if (fetched[i].ok() &&
        serving::AppendBlockRecord(*fetched[i], s.layout, s.cache, kvblock::CrcCheck::kCheckedBefore).ok()) {
      blocks_fetched_.Increment();
      continue;
    }
    // Missing, corrupt or its shard unreachable: the tokens and the blocks
    // before it are here, so compute it again (and offer it back).
    KVTIER_RETURN_IF_ERROR(model_.Prefill(std::span(s.tokens).subspan(i * tpb, tpb), s.cache, scratch));
    ++recomputed;
    blocks_recomputed_.Increment();
    WriteBack(s, s.chain[i], serving::BlockRecord(s.layout, s.cache, i, 0, s.layout.num_layers));
  }
  KVTIER_RETURN_IF_ERROR(
      serving::SetTail(r.tail().latents(), r.tail().indexer_keys(), r.tail().token_count(), s.layout, s.cache));
  if (recomputed > 0) {
    Log(LogLevel::kWarning, "request",
        absl::StrCat("'", absl::CEscape(r.request_id()), "': recomputed ", recomputed, " of ", full,
                     " blocks the cache could not supply"));
  }
  return absl::OkStatus();
}

absl::Status DecodeService::LoadV4(const v1::DecodeRequest& r, std::span<const std::string* const> inline_records,
                                   DecodeSequence& s) {
  const runtime::ModelConfig& c = model_.config();
  const size_t tpb = s.layout.tokens_per_block, restore_blocks = (s.tokens.size() - 1) / tpb;
  if (r.tail().token_count() != 0 || !r.tail().latents().empty() || !r.tail().indexer_keys().empty()) {
    return absl::InvalidArgumentError(
        "a DeepSeek-V4 request carries no tail (the worker runs the tokens after its restore point)");
  }
  if (r.restore_point().empty() != (restore_blocks == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("restore_point must be the record after the first ", restore_blocks,
                                                   " blocks", restore_blocks == 0 ? " (none)" : ""));
  }
  // What came with the request must be whole records of the right kind
  // (their CRC checked here; a fetched record's was as it landed).
  const auto point = std::make_shared<const std::string>(r.restore_point());
  if (restore_blocks > 0) {
    if (absl::Status st = serving::CheckV4Record(*point, s.layout, kvblock::RecordKind::kRestorePoint); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("restore_point: ", st.message()));
    }
  }
  for (size_t i = 0; i < inline_records.size(); ++i) {
    if (inline_records[i] == nullptr) continue;
    if (absl::Status st = serving::CheckV4Record(*inline_records[i], s.layout, kvblock::RecordKind::kBlock); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("inline block ", i, ": ", st.message()));
    }
  }
  std::vector<absl::StatusOr<cache::SharedRecord>> fetched = FetchBlocks(s, restore_blocks, inline_records);
  std::vector<cache::SharedRecord> records;
  absl::Status restored;
  for (size_t i = 0; i < restore_blocks && restored.ok(); ++i) {
    if (inline_records[i] != nullptr) {
      records.push_back(std::make_shared<const std::string>(*inline_records[i]));
    } else if (fetched[i].ok()) {
      records.push_back(*fetched[i]);
    } else {
      restored =
          absl::Status(fetched[i].status().code(), absl::StrCat("block ", i, ": ", fetched[i].status().message()));
    }
  }
  if (restored.ok() && restore_blocks > 0) {
    restored = serving::RestoreV4Records(c, s.layout, records, point, kvblock::CrcCheck::kCheckedBefore, s.cache);
  }
  std::vector<float> scratch(c.vocab_size);
  if (restored.ok()) {
    for (size_t i = 0; i < restore_blocks; ++i)
      (inline_records[i] != nullptr ? blocks_inline_ : blocks_fetched_).Increment();
  } else {
    // A block the cache could not supply (or one whose values cannot be
    // the model's): the tokens are here, so run the prefix again and offer
    // the cache's missing blocks back.
    Log(LogLevel::kWarning, "request",
        absl::StrCat("'", absl::CEscape(r.request_id()), "': cannot restore (", restored.message(),
                     "); recomputing the ", restore_blocks, " blocks before the restore point"));
    s.cache = model_.NewCache(s.layout.codec, s.layout.tokens_per_block);
    KVTIER_RETURN_IF_ERROR(model_.Prefill(std::span(s.tokens).first(restore_blocks * tpb), s.cache, scratch));
    blocks_recomputed_.Increment(static_cast<double>(restore_blocks));
    for (size_t i = 0; i < restore_blocks; ++i) {
      if (inline_records[i] == nullptr && !fetched[i].ok()) {
        WriteBack(s, s.chain[i], serving::V4BlockRecord(c, s.layout, s.cache, i));
      }
    }
  }
  return model_.Prefill(std::span(s.tokens).subspan(restore_blocks * tpb), s.cache, scratch);
}

void DecodeService::OnSealed(DecodeSequence& s, size_t block) {
  if (!s.write_back || block != s.chain.size()) return;
  const uint32_t tpb = s.layout.tokens_per_block;
  s.chain.push_back(kvblock::ChainHash(s.ns, block == 0 ? kvblock::kNoParent : s.chain[block - 1],
                                       kvblock::LayoutId(s.layout), std::span(s.tokens).subspan(block * tpb, tpb)));
  if (WriteBack(s, s.chain.back(),
                s.layout.IsV4() ? serving::V4BlockRecord(model_.config(), s.layout, s.cache, block)
                                : serving::BlockRecord(s.layout, s.cache, block, 0, s.layout.num_layers))) {
    blocks_written_back_.Increment();
  }
  if (s.layout.IsV4()) {
    // A step ends at each boundary: the point there is kept until the
    // generation ends (OnEnding), so only the last one is stored.
    absl::StatusOr<std::string> point = serving::V4RestorePointRecord(model_.config(), s.layout, s.cache);
    if (point.ok()) s.restore_point = {s.chain.back(), *std::move(point)};
  }
}

void DecodeService::OnEnding(DecodeSequence& s) {
  if (!s.restore_point.has_value()) return;
  const kvblock::BlockHash block = s.restore_point->first;  // the point lives on its block's shard
  WriteBack(s, kvblock::RestorePointKey(block), std::move(s.restore_point->second), block);
  s.restore_point.reset();
}

absl::StatusOr<std::shared_ptr<const Caller>> DecodeService::ServiceCaller(
    const grpc::ServerContextBase& context) const {
  KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<const Caller> caller, CallerOf(context));
  KVTIER_RETURN_IF_ERROR(CheckServed(*caller));
  return caller;
}

grpc::ServerUnaryReactor* DecodeService::Info(grpc::CallbackServerContext* context, const v1::InfoRequest* /*request*/,
                                              v1::ServerInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::shared_ptr<const Caller>> caller = ServiceCaller(*context);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  std::vector<kvblock::LatentLayout> layouts;
  for (kernels::Codec codec : kernels::kAllCodecs) {
    layouts.push_back(serving::ModelLayout(model_.config(), model_id_, codec, /*tokens_per_block=*/0));
    if (layouts.back().IsV4()) break;  // the model's own FP8, whatever the codec
  }
  *response = serving::ServerInfoFor("kvtier-decode", model_, model_id_, layouts, "");
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

// One Decode call. Its sequence is prepared on the executor (blocks fetched
// or recomputed), then decoded by the batcher, which wakes the stream after
// each event it posts; the stream writes the events one at a time as they
// come. It owns itself (self_) from its start to OnDone, and each wake-up
// or task holds it too, so that one arriving late finds it still there.
// What to do next is decided under mu_ and done outside it: Finish and
// StartWrite may run reactions inline.
class DecodeService::Stream final : public grpc::ServerWriteReactor<v1::DecodeResponse>,
                                    public std::enable_shared_from_this<Stream> {
 public:
  static Stream* Start(DecodeService* service, grpc::CallbackServerContext* context, const v1::DecodeRequest* request) {
    std::shared_ptr<Stream> stream(new Stream(service, context, request));
    stream->self_ = stream;
    stream->Begin(*context);
    return stream.get();
  }

  void OnWriteDone(bool ok) override {
    bool token;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      token = current_.has_token();
      if (ok && token) service_->tokens_.Increment();
    }
    if (!ok) return Stop(grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading"));
    // After a token only: the finish, once written, stands.
    if (absl::Status allowed = token ? FollowCaller() : absl::OkStatus(); !allowed.ok()) {
      return Stop(ToGrpcStatus(allowed));
    }
    Pump();
  }

  void OnCancel() override { Stop(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled")); }

  void OnDone() override {
    tenant_hold_.reset();
    {
      absl::MutexLock lock(&mu_);
      if (submitted_) service_->sequences_.Decrement();
      if (sequence_ != nullptr) {
        absl::MutexLock sequence_lock(&sequence_->mu);
        sequence_->on_event = nullptr;
      }
    }
    self_.reset();  // may delete this
  }

 private:
  Stream(DecodeService* service, const grpc::CallbackServerContext* context, const v1::DecodeRequest* request)
      : service_(service), context_(context), request_(request) {}

  // A sequence outlives the check its call got as it began: once a reload
  // puts other TLS files or another tenants file in force, a prefill node
  // no longer trusted, or one acting for a tenant removed or taken off the
  // namespace, gets no more tokens.
  absl::Status FollowCaller() {
    KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<const Caller> now, followed_.Now(*context_));
    if (now == caller_) return absl::OkStatus();
    KVTIER_RETURN_IF_ERROR(CheckServed(*now));
    return serving::CheckRequestScope(request_->request_id(), request_->kv_namespace(), *now);
  }

  void Begin(const grpc::CallbackServerContext& context) {
    absl::StatusOr<std::shared_ptr<const Caller>> caller = service_->ServiceCaller(context);
    if (!caller.ok()) return Conclude(ToGrpcStatus(caller.status()));
    if (absl::Status valid = serving::CheckRequestScope(request_->request_id(), request_->kv_namespace(), **caller);
        !valid.ok()) {
      return Conclude(ToGrpcStatus(valid));
    }
    caller_ = *std::move(caller);
    // An end tenant (whom a service acts for) cannot take every sequence.
    if (!caller_->service.empty()) {
      absl::StatusOr<std::shared_ptr<void>> held = service_->per_tenant_.Hold(caller_->tenant);
      if (!held.ok()) return Conclude(ToGrpcStatus(held.status()));
      tenant_hold_ = *std::move(held);
    }
    {
      absl::MutexLock lock(&mu_);
      preparing_ = true;
    }
    if (!service_->preparing_->TrySubmit([self = shared_from_this()] { self->Prepare(); })) {
      Conclude(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            "the decode worker has as many sequences waiting to start as it may hold"));
    }
  }

  // On the executor.
  void Prepare() {
    absl::StatusOr<std::shared_ptr<DecodeSequence>> prepared = service_->Prepare(*request_, *caller_);
    if (!prepared.ok()) return Conclude(ToGrpcStatus(prepared.status()));
    std::shared_ptr<DecodeSequence> s = *std::move(prepared);
    {
      absl::MutexLock lock(&s->mu);
      s->on_event = [weak = weak_from_this()] {
        if (std::shared_ptr<Stream> self = weak.lock()) self->Pump();
      };
    }
    bool stopped;
    {
      absl::MutexLock lock(&mu_);
      sequence_ = s;
      preparing_ = false;
      stopped = stop_.has_value();
    }
    if (stopped) return Pump();  // stopped meanwhile: never submitted, finished now
    // Token 0 (sampled by the prefill node) may already end the generation.
    if (const v1::FinishReason reason = serving::FinishAfter(0, s->next_input, s->limits);
        reason != v1::FINISH_REASON_UNSPECIFIED) {
      v1::DecodeResponse finished;
      finished.mutable_finished()->set_reason(reason);
      finished.mutable_finished()->mutable_usage()->set_generated_tokens(1);
      return Post(*s, std::move(finished), /*last=*/true);  // wakes the stream
    }
    if (absl::Status submitted = service_->batcher_->Submit(s); !submitted.ok()) {
      return Conclude(ToGrpcStatus(submitted));
    }
    {
      absl::MutexLock lock(&mu_);
      submitted_ = true;
      service_->sequences_.Increment();
    }
    Pump();
  }

  // Writes the next event, or finishes when there is no more (or the
  // stream was stopped); nothing while a write or the preparation is under
  // way (their ends pump again).
  void Pump() {
    std::optional<grpc::Status> finish;
    bool write = false;
    std::optional<uint64_t> after_write_back;
    {
      absl::MutexLock lock(&mu_);
      if (concluded_ || writing_ || preparing_) return;
      if (stop_.has_value()) {
        finish = *stop_;
      } else if (sequence_ != nullptr) {
        absl::MutexLock sequence_lock(&sequence_->mu);
        if (!sequence_->events.empty()) {
          current_ = std::move(sequence_->events.front());
          sequence_->events.pop_front();
          writing_ = write = true;
          // Blocks this sequence filled are stored before it reports the
          // end, so the conversation's next turn, sent after it, finds
          // them. (The batcher has posted its last event: last_write is
          // final.)
          if (current_.has_finished()) after_write_back = sequence_->last_write;
        } else if (sequence_->done) {
          finish = ToGrpcStatus(sequence_->error);
        }
      }
    }
    if (finish.has_value()) return Conclude(*finish);
    if (!write) return;
    if (!after_write_back.has_value()) return StartWrite(&current_);
    service_->writer_.WhenAttempted(*after_write_back,
                                    [self = shared_from_this()] { self->StartWrite(&self->current_); });
  }

  // Cancels the sequence (the batcher drops it) and finishes with `why` (or
  // the first reason given) once no write or preparation is under way.
  void Stop(grpc::Status why) {
    {
      absl::MutexLock lock(&mu_);
      if (!stop_.has_value()) stop_ = std::move(why);
      if (sequence_ != nullptr) {
        absl::MutexLock sequence_lock(&sequence_->mu);
        sequence_->cancelled = true;
      }
    }
    Pump();
  }

  void Conclude(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (concluded_) return;
      concluded_ = true;
    }
    service_->requests_.Add({{"code", StatusCodeName(status.error_code())}}).Increment();
    Finish(status);
  }

  DecodeService* const service_;
  const grpc::CallbackServerContext* const context_;  // gRPC's, until OnDone
  const v1::DecodeRequest* const request_;            // gRPC's, until Finish
  std::shared_ptr<Stream> self_;                      // from Start to OnDone
  std::shared_ptr<void> tenant_hold_;                 // a place in the service's per-tenant bound, until OnDone
  std::shared_ptr<const Caller> caller_;              // set before the preparation
  FollowedCaller followed_;                           // by OnWriteDone, one write at a time
  absl::Mutex mu_;
  bool submitted_ ABSL_GUARDED_BY(mu_) = false;  // to the batcher, by Prepare
  std::shared_ptr<DecodeSequence> sequence_ ABSL_GUARDED_BY(mu_);
  bool preparing_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  v1::DecodeResponse current_;  // the event being written; only while writing_
  std::optional<grpc::Status> stop_ ABSL_GUARDED_BY(mu_);
  bool concluded_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerWriteReactor<v1::DecodeResponse>* DecodeService::Decode(grpc::CallbackServerContext* context,
                                                                    const v1::DecodeRequest* request) {
  return Stream::Start(this, context, request);
}

}  // namespace kvtier::decode
