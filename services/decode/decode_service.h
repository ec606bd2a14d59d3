// kvtier.v1.Decode: assembles a sequence's latents (inline blocks, blocks
// from the cache shards, blocks it recomputes when neither has them, the
// float tail), hands the sequence to the continuous batcher and streams its
// tokens; blocks that fill during decode are written back to the cache. On
// gRPC's callback API: a stream holds no thread while it waits for tokens
// (the batcher wakes it), and its preparation runs on an executor.
#ifndef KVTIER_SERVICES_DECODE_DECODE_SERVICE_H_
#define KVTIER_SERVICES_DECODE_DECODE_SERVICE_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "kvtier/v1/decode.grpc.pb.h"
#include "services/base/executor.h"
#include "services/cache/client/block_writer.h"
#include "services/cache/client/shard_set.h"
#include "services/decode/batcher.h"
#include "services/rpc/tenants.h"
#include "services/serving/concurrency_bound.h"

namespace kvtier::decode {

class DecodeService final : public v1::Decode::CallbackService {
 public:
  // None owned; all must outlive the service. Only kvtier services (and
  // services acting for their end tenants) may call. One end tenant holds
  // at most `max_sequences_per_tenant` sequences at once (0: half of
  // options.max_sequences).
  DecodeService(const runtime::Model* model, std::string model_id, cache::ShardSet* shards,
                prometheus::Registry* registry, Batcher::Options options, uint64_t max_sequences_per_tenant = 0);
  ~DecodeService() override;

  grpc::ServerWriteReactor<v1::DecodeResponse>* Decode(grpc::CallbackServerContext* context,
                                                       const v1::DecodeRequest* request) override;
  // The model and the layouts it reads and writes (one a codec, any block
  // size); for kvtier services, as Decode is.
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context, const v1::InfoRequest* request,
                                 v1::ServerInfo* response) override;

 private:
  class Stream;  // one Decode call
  static constexpr size_t kPreparingThreads = 8;
  // Checks the request and builds its sequence, fetching or recomputing the
  // blocks; the caller submits it.
  // The sequence a request continues, its blocks fetched for `caller` (an
  // end tenant a service acts for, or the service itself).
  absl::StatusOr<std::shared_ptr<DecodeSequence>> Prepare(const v1::DecodeRequest& request, const Caller& caller);
  // The blocks a sequence starts from, by model: MLA's sealed blocks
  // (inline, fetched, or recomputed where the cache fails) and the
  // request's tail; a DeepSeek-V4 sequence restored from its blocks and
  // restore point (or recomputed), then the tokens after the point run.
  absl::Status LoadMla(const v1::DecodeRequest& request, std::span<const std::string* const> inline_records,
                       DecodeSequence& sequence);
  absl::Status LoadV4(const v1::DecodeRequest& request, std::span<const std::string* const> inline_records,
                      DecodeSequence& sequence);
  // The first `count` blocks of the sequence's chain from the cache, but
  // for those that came inline (left as an error).
  std::vector<absl::StatusOr<cache::SharedRecord>> FetchBlocks(const DecodeSequence& sequence, size_t count,
                                                               std::span<const std::string* const> inline_records);
  // Queues `record` under `key` (on the shard of `shard_key` when set) for
  // the cache when the sequence writes back; whether it was queued.
  bool WriteBack(DecodeSequence& sequence, const kvblock::BlockHash& key, absl::StatusOr<std::string> record,
                 const std::optional<kvblock::BlockHash>& shard_key = std::nullopt);
  // On the batcher's thread: write-back as blocks fill, and a V4
  // sequence's last restore point as it ends.
  void OnSealed(DecodeSequence& sequence, size_t block);
  void OnEnding(DecodeSequence& sequence);
  // The call's caller; PERMISSION_DENIED unless it is a service.
  absl::StatusOr<std::shared_ptr<const Caller>> ServiceCaller(const grpc::ServerContextBase& context) const;

  const runtime::Model& model_;
  const std::string model_id_;
  cache::ShardSet& shards_;
  cache::BlockWriter writer_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Counter& tokens_;
  prometheus::Counter& blocks_fetched_;
  prometheus::Counter& blocks_inline_;
  prometheus::Counter& blocks_recomputed_;
  prometheus::Counter& blocks_written_back_;
  prometheus::Histogram& batch_size_;
  prometheus::Histogram& step_seconds_;
  prometheus::Gauge& sequences_;
  std::unique_ptr<Batcher> batcher_;  // its thread uses the members above
  // Where streams prepare their sequences (Prepare blocks on the cache and
  // the model); stopped first.
  std::unique_ptr<Executor> preparing_;
  serving::ConcurrencyBound per_tenant_;
};

}  // namespace kvtier::decode

#endif  // KVTIER_SERVICES_DECODE_DECODE_SERVICE_H_
