// Checks of generation requests that the prefill node and the decode worker
// share: request id and namespace, token ids, sampling, limits. Each error
// is INVALID_ARGUMENT naming the field, but for a namespace the caller may
// not use (PERMISSION_DENIED).
#ifndef KVTIER_SERVICES_SERVING_REQUEST_CHECKS_H_
#define KVTIER_SERVICES_SERVING_REQUEST_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/repeated_field.h"
#include "kvtier/v1/generation.pb.h"
#include "services/rpc/tenants.h"
#include "services/runtime/model_config.h"
#include "services/runtime/sampler.h"

namespace kvtier::serving {

// The prefill node's default --max-top-logprobs.
inline constexpr uint32_t kMaxTopLogprobs = 20;
inline constexpr size_t kMaxRequestIdBytes = 128;

// `request_id` at most kMaxRequestIdBytes; `ns` well-formed and one
// `caller` may use.
absl::Status CheckRequestScope(const std::string& request_id, const std::string& ns, const Caller& caller);

// `field` non-empty, each id below the vocabulary.
absl::Status CheckTokenIds(const google::protobuf::RepeatedField<uint32_t>& ids, int64_t vocab_size,
                           const std::string& field);

// Sampling parameters, max_new_tokens >= 1, top_logprobs <=
// `max_top_logprobs`, stop ids in the vocabulary, and `context_tokens` +
// max_new_tokens within the model's positions.
absl::Status CheckGeneration(const runtime::ModelConfig& config, size_t context_tokens,
                             const v1::SamplingParams& sampling, const v1::GenerationLimits& limits,
                             uint32_t max_top_logprobs);

runtime::Sampling ToSampling(const v1::SamplingParams& p);

}  // namespace kvtier::serving

#endif  // KVTIER_SERVICES_SERVING_REQUEST_CHECKS_H_
