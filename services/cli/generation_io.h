// What `kvtier run` and `kvtier generate` share: the prompt and sampling
// flags, and the output (the ids line, or the JSON object of DESIGN.md).
#ifndef KVTIER_SERVICES_CLI_GENERATION_IO_H_
#define KVTIER_SERVICES_CLI_GENERATION_IO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/common/flags.h"
#include "services/runtime/sampler.h"

namespace kvtier::cli {

// "1,2,3" -> ids; INVALID_ARGUMENT naming the bad part, or for none.
absl::StatusOr<std::vector<uint32_t>> ParseIds(const std::string& text);

// --temperature, --top-p, --seed.
struct SamplingFlags {
  std::string temperature, top_p;
  uint64_t seed = 0;
  void Register(FlagParser& flags);
  absl::StatusOr<runtime::Sampling> Parse() const;
};

// {"ids": [...], "logprobs": [...], "top_logprobs": [[[id, lp], ...], ...],
//  "prompt_tokens": N, "cached_tokens": N}
std::string GenerationJson(const std::vector<runtime::Sampled>& out, size_t prompt_tokens, size_t cached_tokens);
// "id id id"
std::string IdsLine(const std::vector<runtime::Sampled>& out);

}  // namespace kvtier::cli

#endif  // KVTIER_SERVICES_CLI_GENERATION_IO_H_
