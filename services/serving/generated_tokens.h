// The rules and messages of a generated token that the prefill node (token
// 0) and the decode worker (the rest) share.
#ifndef KVTIER_SERVICES_SERVING_GENERATED_TOKENS_H_
#define KVTIER_SERVICES_SERVING_GENERATED_TOKENS_H_

#include <cstdint>

#include "kvtier/v1/generation.pb.h"
#include "services/runtime/sampler.h"

namespace kvtier::serving {

// How the generation ends once generated token `index` (0-based) is
// `token`: STOP for a stop id (first), LENGTH when it is the
// max_new_tokens-th, UNSPECIFIED to go on.
v1::FinishReason FinishAfter(uint32_t index, uint32_t token, const v1::GenerationLimits& limits);

v1::GeneratedToken ToGeneratedToken(uint32_t index, const runtime::Sampled& sampled);

}  // namespace kvtier::serving

#endif  // KVTIER_SERVICES_SERVING_GENERATED_TOKENS_H_
