#include "services/prefill/prefill_service.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/cache/client/cache_client.h"
#include "services/prefill/progress_watchdog.h"
#include "services/rpc/caller.h"
#include "services/rpc/client_identity.h"
#include "services/rpc/grpc_status.h"
#include "services/serving/generated_tokens.h"
#include "services/serving/model_server.h"
#include "services/serving/request_checks.h"
#include "services/serving/sequence_blocks.h"

namespace kvtier::prefill {

// What Prefill leaves for the rest of the request.
struct PrefillService::Prefilled {
  uint32_t cached_tokens = 0;
  v1::DecodeRequest decode;
};

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
                                                                                0.5, 1, 2.5, 5, 10, 30})) {}

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

grpc::Status PrefillService::Count(grpc::Status status) {
  requests_.Add({{"code", StatusCodeName(status.error_code())}}).Increment();
  return status;
}

namespace {

// The end tenant a call acts for at the cache and the decode workers: the
// caller, unless it is a service itself (or there are no tenants).
std::string ActingFor(const Caller& caller) { return caller.IsService() ? "" : caller.tenant; }

}  // namespace

absl::StatusOr<PrefillService::Prefilled> PrefillService::Prefill(const v1::GenerateRequest& r, const std::string& ns,
                                                                  const Caller& caller) {
  const std::string acting_for = ActingFor(caller);
  const std::vector<uint32_t> prompt(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  const uint32_t tpb = layout_.tokens_per_block;
  const std::vector<kvblock::BlockHash> chain = kvblock::ComputeBlockChain(ns, kvblock::LayoutId(layout_), tpb, prompt);
  // The logits after the last prompt token must be computed here, so the
  // block holding it is never taken from the cache.
  const size_t reusable = std::min(chain.size(), (prompt.size() - 1) / tpb);
  runtime::SequenceCache cache = model_.NewCache(layout_.codec, tpb);
  size_t cached_blocks = 0;
  if (reusable > 0) {
    const std::vector<kvblock::BlockHash> prefix(chain.begin(), chain.begin() + reusable);
    const size_t matched = shards_.MatchPrefix(ns, layout_, prefix, acting_for);
    const std::vector<kvblock::BlockHash> wanted(prefix.begin(), prefix.begin() + matched);
    // A block gone since Match, corrupt, or on a shard that stopped
    // answering ends the reuse there: the rest is prefilled.
    for (absl::StatusOr<cache::SharedRecord>& record : shards_.Fetch(ns, layout_, wanted, acting_for)) {
      // Fetch checked each record's CRC as it landed.
      absl::Status appended =
          record.ok() ? serving::AppendBlockRecord(*record, layout_, cache, kvblock::CrcCheck::kCheckedBefore)
                      : record.status();
      if (!appended.ok()) {
        Log(LogLevel::kWarning, "request",
            absl::StrCat("'", absl::CEscape(r.request_id()), "': cached block ", cached_blocks, " of ", matched,
                         " unusable (", appended.message(), "); prefilling from there"));
        break;
      }
      ++cached_blocks;
    }
  }
  // Prefill the rest; each layer's newly filled blocks go to their shards
  // as soon as that layer is done (a reader's go to the decode worker
  // inline, and it writes none back).
  cache::ShardedPut put(shards_, ns, layout_, options_.cache_deadline, acting_for);
  const bool store = caller.MayWrite();
  std::vector<float> logits(model_.config().vocab_size);
  const std::span<const uint32_t> suffix = std::span(prompt).subspan(cached_blocks * tpb);
  const runtime::SequenceTokens pass{suffix, &cache, logits};
  absl::Status put_error;
  KVTIER_RETURN_IF_ERROR(model_.Forward(std::span(&pass, 1), [&](size_t layer) {
    for (size_t b = cached_blocks; b < cache.blocks[layer].size(); ++b) {
      absl::StatusOr<std::string> slice = serving::BlockRecord(layout_, cache, b, static_cast<uint32_t>(layer), 1);
      if (slice.ok() && store) put.Write(chain[b], *slice);
    }
    put.Flush();  // this layer's slices go now, not with the last layer's
  }));
  const std::set<kvblock::BlockHash> stored = put.Finish();

  Prefilled out;
  out.cached_tokens = static_cast<uint32_t>(cached_blocks * tpb);
  v1::DecodeRequest& d = out.decode;
  d.set_request_id(r.request_id());
  d.set_kv_namespace(ns);
  *d.mutable_layout() = kvblock::LayoutToProto(layout_);
  *d.mutable_token_ids() = r.prompt_token_ids();
  for (const kvblock::BlockHash& h : chain) d.add_block_hashes(std::string(kvblock::HashAsBytes(h)));
  // Blocks the cache did not take travel inline (a shard down or slow).
  for (size_t b = cached_blocks; b < chain.size(); ++b) {
    if (stored.contains(chain[b])) continue;
    KVTIER_ASSIGN_OR_RETURN(std::string record, serving::BlockRecord(layout_, cache, b, 0, layout_.num_layers));
    v1::InlineBlock& block = *d.add_inline_blocks();
    block.set_block_index(static_cast<uint32_t>(b));
    block.set_data(std::move(record));
    blocks_inline_.Increment();
  }
  if (d.inline_blocks_size() > 0) {
    Log(LogLevel::kWarning, "request",
        absl::StrCat("'", absl::CEscape(r.request_id()), "': the cache did not store ", d.inline_blocks_size(), " of ",
                     chain.size() - cached_blocks, " new blocks; they go to the decode worker inline"));
  }
  d.set_skip_write_back(!store);
  d.mutable_tail()->set_token_count(static_cast<uint32_t>(prompt.size() % tpb));
  d.mutable_tail()->set_latents(serving::TailBytes(cache));
  d.mutable_tail()->set_indexer_keys(serving::TailIndexerKeys(cache, layout_));
  *d.mutable_first_token() = serving::ToGeneratedToken(
      0, runtime::Sample(logits, serving::ToSampling(r.sampling()), 0, r.limits().top_logprobs()));
  *d.mutable_sampling() = r.sampling();
  *d.mutable_limits() = r.limits();
  return out;
}

grpc::Status PrefillService::Info(grpc::ServerContext* context, const v1::InfoRequest* /*request*/,
                                  v1::ServerInfo* response) {
  absl::StatusOr<std::shared_ptr<const Caller>> caller = CallerOf(*context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  *response = serving::ServerInfoFor("kvtier-prefill", model_, model_id_, {layout_}, (*caller)->default_namespace);
  return grpc::Status::OK;
}

grpc::Status PrefillService::Generate(grpc::ServerContext* context, const v1::GenerateRequest* r,
                                      grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const absl::Time start = absl::Now();
  const runtime::ModelConfig& c = model_.config();
  absl::StatusOr<std::shared_ptr<const Caller>> caller = CallerOf(*context);
  if (!caller.ok()) return Count(ToGrpcStatus(caller.status()));
  const std::string ns = r->kv_namespace().empty() ? (*caller)->default_namespace : r->kv_namespace();
  absl::Status valid = serving::CheckRequestScope(r->request_id(), ns, **caller);
  if (valid.ok()) valid = serving::CheckTokenIds(r->prompt_token_ids(), c.vocab_size, "prompt_token_ids");
  if (valid.ok())
    valid =
        serving::CheckGeneration(c, r->prompt_token_ids_size(), r->sampling(), r->limits(), options_.max_top_logprobs);
  if (!valid.ok()) return Count(ToGrpcStatus(valid));

  absl::StatusOr<Prefilled> p = Prefill(*r, ns, **caller);
  if (!p.ok()) return Count(ToGrpcStatus(p.status()));
  prompt_tokens_.Increment(r->prompt_token_ids_size());
  cached_tokens_.Increment(p->cached_tokens);
  v1::GenerateResponse first;
  *first.mutable_token() = p->decode.first_token();
  if (!writer->Write(first)) return Count(grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading"));
  const absl::Duration ttft = absl::Now() - start;
  time_to_first_token_.Observe(absl::ToDoubleSeconds(ttft));

  v1::Usage usage;
  usage.set_prompt_tokens(static_cast<uint32_t>(r->prompt_token_ids_size()));
  usage.set_cached_tokens(p->cached_tokens);
  usage.set_time_to_first_token_us(static_cast<uint64_t>(absl::ToInt64Microseconds(ttft)));
  if (const v1::FinishReason reason = serving::FinishAfter(0, p->decode.first_token().token_id(), r->limits());
      reason != v1::FINISH_REASON_UNSPECIFIED) {  // token 0 was the whole generation
    v1::GenerateResponse done;
    done.mutable_finished()->set_reason(reason);
    usage.set_generated_tokens(1);
    *done.mutable_finished()->mutable_usage() = usage;
    writer->Write(done);
    return Count(grpc::Status::OK);
  }
  return Count(Relay(context, p->decode, **caller, usage, writer));
}

grpc::Status PrefillService::Relay(grpc::ServerContext* context, const v1::DecodeRequest& request, const Caller& caller,
                                   v1::Usage usage, grpc::ServerWriter<v1::GenerateResponse>* writer) {
  uint32_t next_index = 1;  // the next token the client has not seen
  std::string failures;
  std::shared_ptr<const Decoders> decoders;
  {
    absl::MutexLock lock(&decoders_mu_);
    decoders = decoders_;
  }
  if (decoders->empty()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no decode worker is known");
  const size_t first = next_decoder_.fetch_add(1);
  for (size_t attempt = 0; attempt < decoders->size(); ++attempt) {
    const auto& [target, stub] = (*decoders)[(first + attempt) % decoders->size()];
    // Cancellation and the deadline of the client's call carry over.
    std::unique_ptr<grpc::ClientContext> call = grpc::ClientContext::FromServerContext(*context);
    if (const std::string acting_for = ActingFor(caller); !acting_for.empty()) {
      call->AddMetadata(kActingForMetadata, acting_for);
    }
    std::unique_ptr<grpc::ClientReader<v1::DecodeResponse>> reader = stub->Decode(call.get(), request);
    ProgressWatchdog watchdog(call.get(), options_.decode_idle);
    v1::DecodeResponse event;
    bool finished = false;
    while (!finished && reader->Read(&event)) {
      watchdog.Progress();
      v1::GenerateResponse out;
      if (event.has_token()) {
        // A retried worker repeats what an earlier one already streamed
        // (sampling depends only on seed and index): skip those.
        if (event.token().index() < next_index) continue;
        if (event.token().index() != next_index) {
          call->TryCancel();
          reader->Finish();
          return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("decode worker ", target, " skipped from token ",
                                                                       next_index, " to ", event.token().index()));
        }
        ++next_index;
        *out.mutable_token() = event.token();
      } else if (event.has_finished()) {
        usage.set_generated_tokens(event.finished().usage().generated_tokens());
        out.mutable_finished()->set_reason(event.finished().reason());
        *out.mutable_finished()->mutable_usage() = usage;
        finished = true;
      }
      if (!writer->Write(out)) {
        call->TryCancel();
        reader->Finish();
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading");
      }
    }
    const grpc::Status status = reader->Finish();
    if (finished) return grpc::Status::OK;
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled");
    // Another worker can take over from where this one stopped only for
    // faults of the worker itself, not for a request it rejected.
    const bool stalled = watchdog.fired();
    const bool retryable = stalled || status.ok() || status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    const std::string why = stalled       ? absl::StrCat("no progress for ", absl::FormatDuration(options_.decode_idle))
                            : status.ok() ? "stream ended without a finish"
                                          : status.error_message();
    absl::StrAppend(&failures, failures.empty() ? "" : "; ", target, ": ", why);
    if (!retryable) return grpc::Status(status.error_code(), absl::StrCat("decode worker ", target, ": ", why));
    Log(LogLevel::kWarning, "request",
        absl::StrCat("'", absl::CEscape(request.request_id()), "': decode worker ", target, " failed after token ",
                     next_index - 1, " (", why, ")", attempt + 1 < decoders->size() ? "; trying the next" : ""));
  }
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      absl::StrCat("no decode worker could continue the request after token ", next_index - 1, ": ", failures));
}

}  // namespace kvtier::prefill
