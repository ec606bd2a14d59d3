// Choosing the next token from logits: greedy, or temperature with top-p,
// reproducible from a seed; with the chosen token's log-probability and the
// most likely alternatives.
#ifndef KVTIER_SERVICES_RUNTIME_SAMPLER_H_
#define KVTIER_SERVICES_RUNTIME_SAMPLER_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace kvtier::runtime {

struct Sampling {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // 1: no truncation
  uint64_t seed = 0;
};

// INVALID_ARGUMENT unless temperature is finite and in [0, 100] and top_p in
// (0, 1].
absl::Status ValidateSampling(const Sampling& s);

struct Sampled {
  uint32_t token = 0;
  float logprob = 0;                            // log-softmax of the logits (before temperature) at token
  std::vector<std::pair<uint32_t, float>> top;  // most likely first
};

// ln(sum of exp(logit)): a token's logprob is its logit minus this (float
// exps summed in double), as Sample reports them.
double LogSumExp(std::span<const float> logits);

// The draw for generated token `step` depends only on (seed, step), so a
// generation split across machines samples the same tokens.
Sampled Sample(std::span<const float> logits, const Sampling& s, uint64_t step, size_t top_n);

// One Sample call's arguments.
struct SampleRequest {
  std::span<const float> logits;
  const Sampling* sampling = nullptr;
  uint64_t step = 0;
  size_t top_n = 0;
};

// A token for each request (a decode step's sequences), the requests split
// over the kernel threads; each result is what Sample gives for it.
std::vector<Sampled> SampleEach(std::span<const SampleRequest> requests);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_SAMPLER_H_
