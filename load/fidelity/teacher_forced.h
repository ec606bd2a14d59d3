// How much a latent codec costs a model's predictions on real text: the
// text runs teacher-forced, a token a step, with the latents of the tokens
// before each one held as the cache holds them (full blocks sealed in the
// codec, the tail in float), against the same model with every latent in
// float. Scores per codec: perplexity of the text, KL divergence of the
// next-token distributions from the float model's, and how often the most
// likely next token is the float model's.
#ifndef KVTIER_LOAD_FIDELITY_TEACHER_FORCED_H_
#define KVTIER_LOAD_FIDELITY_TEACHER_FORCED_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/kernels/codec.h"
#include "services/runtime/model.h"

namespace kvtier::fidelity {

struct Scores {
  std::string name;  // "float", a codec's name, or where it was measured
  size_t positions = 0;
  double nll_sum = 0;     // -ln p(the text's next token), nats
  double kl_sum = 0;      // KL(float || this), nats
  size_t top1_agree = 0;  // most likely token the float model's
  // Where the served logprobs differ most from `compare_to`'s (services).
  double max_logprob_difference = 0;

  double Perplexity() const;
  double MeanKl() const;
  double Top1Agreement() const;
  // One position: the float model's log-probabilities, this one's, and the
  // token that came next.
  void Add(std::span<const float> reference, std::span<const float> logprobs, uint32_t next);
};

// ids split into windows of `window` tokens, each run as its own sequence
// from position 0 (the model's training context); every token but a
// window's last is a position.
struct Windows {
  std::span<const uint32_t> ids;
  size_t window = 512;
  size_t count() const { return (ids.size() + window - 1) / window; }
  std::span<const uint32_t> operator[](size_t i) const;
  size_t positions() const;
};

// log-softmax of `logits` into `out` (same size), as the servers'
// logprobs are computed (runtime::LogSumExp).
void LogSoftmax(std::span<const float> logits, std::span<float> out);

// The float model and each codec over every position, all in one batch per
// step (the CPU runtime's results do not depend on the batch). Scores in the
// order float, then `codecs`. When `kept` is set, (*kept)[run] gets that
// run's log-probabilities at the first `keep_positions` positions,
// [position][vocab], for ScoreServed.
absl::StatusOr<std::vector<Scores>> ScoreInProcess(const runtime::Model& model, const Windows& text,
                                                   uint32_t tokens_per_block, std::span<const kernels::Codec> codecs,
                                                   size_t keep_positions = 0,
                                                   std::vector<std::vector<float>>* kept = nullptr);

// What a prefill node computes at each of the first `positions` positions
// when the cache holds what the positions before stored: the prompt's whole
// blocks before its last token come from the cache (each block computed as
// the one pass that first completed it, over the blocks before it in
// `codec`), the rest runs as one pass over them. [position][vocab]
// log-probabilities, to compare ScoreServed's with exactly: the one-token
// steps of ScoreInProcess round differently, and where a router's scores
// nearly tie that can choose other experts.
absl::StatusOr<std::vector<float>> LogprobsAsServed(const runtime::Model& model, const Windows& text,
                                                    uint32_t tokens_per_block, kernels::Codec codec, size_t positions);

// The same through a prefill node: for each position a Generate of its
// window so far, one token, every token's logprob (the node runs with
// --max-top-logprobs at the vocabulary), so every full block of the window
// before the position comes from the cache, where the positions before it
// put them. `positions` at most (of the text's first ones). `reference`:
// ScoreInProcess's float_logprobs; `compare_to`, when not empty, the
// in-process logprobs of the node's codec, whose largest difference from
// the served ones goes into max_logprob_difference. `cached_tokens`, when
// set, gets the prompt tokens the cache supplied, summed;
// `reference_scores`, the float model's own scores over the same
// positions.
absl::StatusOr<Scores> ScoreServed(const std::string& prefill_target, const Windows& text, size_t positions,
                                   uint32_t vocab_size, std::span<const float> reference,
                                   std::span<const float> compare_to, uint64_t* cached_tokens = nullptr,
                                   Scores* reference_scores = nullptr);

}  // namespace kvtier::fidelity

#endif  // KVTIER_LOAD_FIDELITY_TEACHER_FORCED_H_
