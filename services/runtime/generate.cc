#include "services/runtime/generate.h"

#include "absl/strings/str_cat.h"
#include "services/base/status.h"

namespace kvtier::runtime {

absl::StatusOr<std::vector<Sampled>> Generate(const Model& model, const std::vector<uint32_t>& prompt,
                                              const GenerateOptions& o) {
  const ModelConfig& c = model.config();
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt id ", prompt[i], " at position ", i, " is outside the vocabulary of ", c.vocab_size));
    }
  }
  if (prompt.size() + o.max_new_tokens > static_cast<size_t>(c.max_position_embeddings)) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", prompt.size(), ") + max_new_tokens (", o.max_new_tokens,
                                                   ") exceeds max_position_embeddings ", c.max_position_embeddings));
  }
  KVTIER_RETURN_IF_ERROR(ValidateSampling(o.sampling));
  if (o.cached_prefix > 0 && (o.tokens_per_block == 0 || o.cached_prefix % o.tokens_per_block != 0 ||
                              o.cached_prefix >= prompt.size() || c.v4.has_value())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a cached prefix of ", o.cached_prefix, " tokens: it must be whole blocks of ", o.tokens_per_block,
        " tokens, fewer than the prompt's ", prompt.size(), ", of an MLA model (DeepSeek-V2 or the V3 family)"));
  }
  SequenceCache cache = model.NewCache(o.codec, o.tokens_per_block);
  cache.sealed_rows = o.sealed_latents;
  std::vector<float> logits(c.vocab_size);
  const std::span<const uint32_t> ids(prompt);
  if (o.cached_prefix > 0) KVTIER_RETURN_IF_ERROR(model.Prefill(ids.first(o.cached_prefix), cache, logits));
  KVTIER_RETURN_IF_ERROR(model.Prefill(ids.subspan(o.cached_prefix), cache, logits));
  std::vector<Sampled> out;
  for (uint32_t i = 0; i < o.max_new_tokens; ++i) {
    out.push_back(Sample(logits, o.sampling, i, o.top_logprobs));
    if (i + 1 < o.max_new_tokens) KVTIER_RETURN_IF_ERROR(model.Step(out.back().token, cache, logits));
  }
  return out;
}

}  // namespace kvtier::runtime
