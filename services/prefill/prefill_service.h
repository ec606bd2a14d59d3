// kvtier.v1.Prefill, the front door: for a prompt, reuses the longest
// cached prefix, prefills the rest while streaming each layer's new blocks
// to the cache shards, samples the first token, then hands the sequence to
// a decode worker and relays its tokens (retrying another worker if one
// becomes unavailable). On gRPC's callback API: the prefill runs on an
// executor, and a generation holds no thread while tokens stream from the
// decode worker to the client.
#ifndef KVTIER_SERVICES_PREFILL_PREFILL_SERVICE_H_
#define KVTIER_SERVICES_PREFILL_PREFILL_SERVICE_H_

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <atomic>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "kvtier/v1/decode.grpc.pb.h"
#include "kvtier/v1/prefill.grpc.pb.h"
#include "services/base/executor.h"
#include "services/cache/client/shard_set.h"
#include "services/prefill/stall_watch.h"
#include "services/rpc/tenants.h"
#include "services/runtime/model.h"
#include "services/runtime/sampler.h"
#include "services/serving/concurrency_bound.h"
#include "services/serving/request_checks.h"

namespace kvtier::prefill {

using Decoders = std::vector<std::pair<std::string, std::shared_ptr<v1::Decode::Stub>>>;

struct PrefillOptions {
  kernels::Codec codec = kernels::Codec::kInt8;
  uint32_t tokens_per_block = 64;
  absl::Duration cache_deadline = absl::Seconds(5);
  // A decode worker's stream that sends nothing this long is given up (and
  // the next worker tried).
  absl::Duration decode_idle = absl::Seconds(30);
  // Most alternatives a request may ask for with each token.
  uint32_t max_top_logprobs = serving::kMaxTopLogprobs;
  // Generations under way at once for one tenant (with a tenants file)
  // and from one client address.
  uint64_t max_generations_per_tenant = 64;
  uint64_t max_generations_per_client = 64;
  // Prompts prefilled at once; more wait their turn. A burst's prompts
  // prefilled together reach the decode workers together, so their first
  // steps carry full batches; the default matches a decode worker's batch.
  uint64_t max_concurrent_prefills = 32;
  // DeepSeek-V4: besides the restore point at each prompt's last boundary,
  // one after every multiple of this many blocks (0: none), so that
  // prompts sharing a prefix that no prompt ended at can restore near its
  // end.
  uint32_t restore_every = 8;
};

class PrefillService final : public v1::Prefill::CallbackService {
 public:
  // None owned; all must outlive the service. No decode worker until
  // SetDecoders. A request without a namespace uses its caller's first.
  PrefillService(const runtime::Model* model, std::string model_id, cache::ShardSet* shards,
                 prometheus::Registry* registry, PrefillOptions options);
  ~PrefillService() override;

  // The decode workers ("host:port" each) that new requests go to; a
  // worker in both lists keeps its connection. Requests under way finish
  // on the workers they had.
  void SetDecoders(const std::vector<std::string>& targets);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* context,
                                                           const v1::GenerateRequest* request) override;
  // The model, the layout this node writes, and the caller's default
  // namespace; any authenticated caller may ask.
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context, const v1::InfoRequest* request,
                                 v1::ServerInfo* response) override;

 private:
  // What Prefill leaves for the rest of the request.
  struct Prefilled {
    uint32_t cached_tokens = 0;
    v1::DecodeRequest decode;
  };
  // A prompt's pass: the sequence after it, the logits after its last
  // token, and what the rest of Prefill needs to hand it on.
  struct Pass {
    runtime::SequenceCache cache;
    std::vector<float> logits;
    size_t cached_blocks = 0;
    std::set<kvblock::BlockHash> stored = {};  // blocks the cache took
    size_t decode_needs = 0;                   // blocks a decode worker reads before it continues
    std::string restore_point = {};            // DeepSeek-V4: the record the worker continues from
  };
  class Stream;      // one Generate call
  class DecodeCall;  // a Stream's call to one decode worker
  static constexpr size_t kMaxQueuedPrefills = 1024;
  // Everything up to the first token: cached prefix, prefill, blocks to the
  // cache, the DecodeRequest for the rest.
  // The prompt's blocks read from the cache, the rest computed and stored
  // for `caller` (a reader's are not stored).
  absl::StatusOr<Prefilled> Prefill(const v1::GenerateRequest& request, const std::string& ns, const Caller& caller);
  // MLA models: the latents of the cached prefix's blocks, the rest
  // prefilled, each layer's new blocks streamed to the shards.
  absl::StatusOr<Pass> PrefillMla(const v1::GenerateRequest& request, std::span<const uint32_t> prompt,
                                  const std::vector<kvblock::BlockHash>& chain, const std::string& ns,
                                  const Caller& caller);
  // DeepSeek-V4: restored from the longest cached prefix that ends at a
  // restore point, the rest prefilled in passes that stop where new
  // restore points are taken (kvblock::NewRestorePoints): the last at the
  // last boundary before the prompt's last token, where the decode worker
  // continues. The points are stored with the new blocks.
  absl::StatusOr<Pass> PrefillV4(const v1::GenerateRequest& request, std::span<const uint32_t> prompt,
                                 const std::vector<kvblock::BlockHash>& chain, const std::string& ns,
                                 const Caller& caller);
  // The decode workers now, and where the next request starts among them.
  std::pair<std::shared_ptr<const Decoders>, size_t> PickDecoders();

  const runtime::Model& model_;
  const std::string model_id_;
  cache::ShardSet& shards_;
  const PrefillOptions options_;
  const kvblock::LatentLayout layout_;
  absl::Mutex decoders_mu_;
  std::shared_ptr<const Decoders> decoders_ ABSL_GUARDED_BY(decoders_mu_);
  std::atomic<size_t> next_decoder_{0};
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& cached_tokens_;
  prometheus::Counter& blocks_inline_;
  prometheus::Histogram& time_to_first_token_;
  StallWatch stalls_;  // over every decode worker's stream
  // Where Generate calls prefill (Prefill blocks on the model and the
  // cache); stopped first.
  std::unique_ptr<Executor> prefilling_;
  serving::ConcurrencyBound per_tenant_;
  serving::ConcurrencyBound per_client_;
};

}  // namespace kvtier::prefill

#endif  // KVTIER_SERVICES_PREFILL_PREFILL_SERVICE_H_
