#include "services/serving/generated_tokens.h"

#include <algorithm>

namespace kvtier::serving {

v1::FinishReason FinishAfter(uint32_t index, uint32_t token, const v1::GenerationLimits& limits) {
  const auto& stops = limits.stop_token_ids();
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) return v1::FINISH_REASON_STOP;
  if (index + 1 >= limits.max_new_tokens()) return v1::FINISH_REASON_LENGTH;
  return v1::FINISH_REASON_UNSPECIFIED;
}

v1::GeneratedToken ToGeneratedToken(uint32_t index, const runtime::Sampled& sampled) {
  v1::GeneratedToken token;
  token.set_index(index);
  token.set_token_id(sampled.token);
  token.set_logprob(sampled.logprob);
  for (const auto& [id, logprob] : sampled.top) {
    v1::TopLogprob& t = *token.add_top_logprobs();
    t.set_token_id(id);
    t.set_logprob(logprob);
  }
  return token;
}

}  // namespace kvtier::serving
