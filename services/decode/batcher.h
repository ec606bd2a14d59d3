// Continuous batching for the decode worker: every step runs one token of
// each active sequence through the model as one batch (runtime::Model::
// Forward reads each weight once per step for all of them). A sequence
// submitted while others run joins at the next step; a finished or
// cancelled one leaves at once.
#ifndef KVTIER_SERVICES_DECODE_BATCHER_H_
#define KVTIER_SERVICES_DECODE_BATCHER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "kvtier/v1/decode.pb.h"
#include "services/kvblock/block_key.h"
#include "services/kvblock/layout.h"
#include "services/runtime/model.h"
#include "services/runtime/sampler.h"

namespace kvtier::decode {

// One sequence being decoded. The service fills the first group, then hands
// it to the batcher, whose thread alone touches `cache` and `tokens` from
// then on; the stream reads what the batcher posts under `mu`.
struct DecodeSequence {
  runtime::SequenceCache cache;
  std::vector<uint32_t> tokens;  // ids whose latents `cache` holds
  uint32_t next_input = 0;       // fed at the next step
  uint32_t next_index = 1;       // generated index the next step samples
  runtime::Sampling sampling;
  v1::GenerationLimits limits;  // max_new_tokens counts generated index 0
  // Write-back of the blocks that fill: the key chain so far (one hash per
  // sealed block), under the request's namespace and layout.
  bool write_back = true;
  std::string ns;
  std::string acting_for;  // the end tenant its cache calls are for (empty: the worker's own)
  kvblock::LatentLayout layout;
  std::vector<kvblock::BlockHash> chain;
  uint64_t last_write = 0;  // BlockWriter ticket of its latest write-back
  // DeepSeek-V4: the restore point at the last boundary decoded past (its
  // record, and the key of the block before it), stored as it ends.
  std::optional<std::pair<kvblock::BlockHash, std::string>> restore_point;

  absl::Mutex mu;
  std::deque<v1::DecodeResponse> events ABSL_GUARDED_BY(mu);  // to stream, in order
  // Called (outside mu) after each event or the end is posted: the stream
  // writes it.
  std::function<void()> on_event ABSL_GUARDED_BY(mu);
  bool done ABSL_GUARDED_BY(mu) = false;  // no more events
  absl::Status error ABSL_GUARDED_BY(mu);
  bool cancelled ABSL_GUARDED_BY(mu) = false;  // set by the stream
};

class Batcher {
 public:
  // Called on the batcher thread after a step sealed block `block` of a
  // sequence (for write-back to the cache).
  using BlockSealed = std::function<void(DecodeSequence& sequence, size_t block)>;
  // Called on the batcher thread before the event that ends a finished
  // generation is posted.
  using Ending = std::function<void(DecodeSequence& sequence)>;
  struct Options {
    size_t max_batch = 32;       // sequences per step; more wait their turn
    size_t max_sequences = 256;  // active + waiting; beyond: RESOURCE_EXHAUSTED
  };
  // Called on the batcher thread after each step (for metrics).
  using StepDone = std::function<void(size_t batch, double seconds)>;
  Batcher(const runtime::Model& model, Options options, BlockSealed on_sealed, Ending on_ending, StepDone on_step);
  ~Batcher();  // finishes the current step, fails what is left with UNAVAILABLE

  absl::Status Submit(std::shared_ptr<DecodeSequence> sequence);

 private:
  void Loop();
  // One token for each of `batch`; posts its events.
  void Step(const std::vector<std::shared_ptr<DecodeSequence>>& batch);
  // Step's work. A batch whose pass fails is undone and run again one
  // sequence at a time: only a sequence that fails alone is failed.
  void Advance(const std::vector<std::shared_ptr<DecodeSequence>>& batch);

  const runtime::Model& model_;
  const Options options_;
  BlockSealed on_sealed_;
  Ending on_ending_;
  StepDone on_step_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<DecodeSequence>> sequences_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  size_t next_turn_ = 0;  // batcher thread only: where the next step's window starts
  // Batcher thread only: a step's logits, row after row, kept between steps
  // (a fresh [batch][vocab] buffer each step faulted its pages in again).
  std::vector<float> logits_;
  std::thread thread_;
};

// Posts an event (or the end) to the sequence's stream.
void Post(DecodeSequence& sequence, v1::DecodeResponse event, bool last);
void Fail(DecodeSequence& sequence, absl::Status error);

}  // namespace kvtier::decode

#endif  // KVTIER_SERVICES_DECODE_BATCHER_H_
