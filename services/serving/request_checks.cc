#include "services/serving/request_checks.h"

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
#include "services/kvblock/block_key.h"

namespace kvtier::serving {

absl::Status CheckRequestScope(const std::string& request_id, const std::string& ns, const Caller& caller) {
  if (request_id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id is longer than ", kMaxRequestIdBytes, " bytes"));
  }
  KVTIER_RETURN_IF_ERROR(kvblock::ValidateNamespace(ns));
  return CheckNamespace(caller, ns);
}

absl::Status CheckTokenIds(const google::protobuf::RepeatedField<uint32_t>& ids, int64_t vocab_size,
                           const std::string& field) {
  if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] = ", ids[i], " is outside the vocabulary of ", vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGeneration(const runtime::ModelConfig& config, size_t context_tokens,
                             const v1::SamplingParams& sampling, const v1::GenerationLimits& limits,
                             uint32_t max_top_logprobs) {
  KVTIER_RETURN_IF_ERROR(runtime::ValidateSampling(ToSampling(sampling)));
  if (limits.max_new_tokens() < 1) return absl::InvalidArgumentError("limits.max_new_tokens must be at least 1");
  if (limits.top_logprobs() > max_top_logprobs) {
    return absl::InvalidArgumentError(absl::StrCat("limits.top_logprobs must be at most ", max_top_logprobs));
  }
  if (!limits.stop_token_ids().empty()) {
    KVTIER_RETURN_IF_ERROR(CheckTokenIds(limits.stop_token_ids(), config.vocab_size, "limits.stop_token_ids"));
  }
  if (context_tokens + limits.max_new_tokens() > static_cast<size_t>(config.max_position_embeddings)) {
    return absl::InvalidArgumentError(absl::StrCat(context_tokens, " tokens + max_new_tokens ", limits.max_new_tokens(),
                                                   " exceed the model's ", config.max_position_embeddings,
                                                   " positions"));
  }
  return absl::OkStatus();
}

runtime::Sampling ToSampling(const v1::SamplingParams& p) {
  runtime::Sampling s;
  s.temperature = p.temperature();
  s.top_p = p.top_p() == 0.0f ? 1.0f : p.top_p();  // unset: no truncation
  s.seed = p.seed();
  return s;
}

}  // namespace kvtier::serving
