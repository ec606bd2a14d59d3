// A whole generation in process: prompt, then new tokens, one step at a time.
#ifndef KVTIER_SERVICES_RUNTIME_GENERATE_H_
#define KVTIER_SERVICES_RUNTIME_GENERATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "services/runtime/model.h"
#include "services/runtime/sampler.h"

namespace kvtier::runtime {

struct GenerateOptions {
  uint32_t max_new_tokens = 16;
  kernels::Codec codec = kernels::Codec::kBf16;
  uint32_t tokens_per_block = 64;
  Sampling sampling;
  size_t top_logprobs = 5;
  // Prompt tokens (whole blocks, fewer than the prompt's) prefilled on
  // their own first: their blocks are sealed in `codec` before the rest is
  // prefilled over those codes, as in a served turn whose prefix came from
  // the cache.
  uint32_t cached_prefix = 0;
  // When set, [layer] gets the float latents of every block sealed, in
  // order (SequenceCache::sealed_rows).
  std::vector<std::vector<float>>* sealed_latents = nullptr;
};

// INVALID_ARGUMENT for an empty prompt, ids outside the vocabulary, a prompt
// plus generation longer than max_position_embeddings, bad sampling, or a
// cached prefix that is not whole blocks short of the prompt (or is asked
// of a DeepSeek-V4 model, which keeps no blocks of latents).
absl::StatusOr<std::vector<Sampled>> Generate(const Model& model, const std::vector<uint32_t>& prompt,
                                              const GenerateOptions& options);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_GENERATE_H_
