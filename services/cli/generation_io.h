// What `kvtier run` and `kvtier generate` share: the prompt and sampling
// flags, and the output (the ids line, or the JSON object of DESIGN.md).
#ifndef KVTIER_SERVICES_CLI_GENERATION_IO_H_
#define KVTIER_SERVICES_CLI_GENERATION_IO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/base/flags.h"
#include "services/runtime/sampler.h"

namespace kvtier::cli {

// "1,2,3" -> ids; INVALID_ARGUMENT naming the bad part, or for none.
absl::StatusOr<std::vector<uint32_t>> ParseIds(const std::string& text);

// --prompt-ids and --prompt: exactly one of them.
struct PromptFlags {
  std::string ids, text;
  void Register(FlagParser& flags);
  // INVALID_ARGUMENT unless exactly one is given.
  absl::Status Check() const;
  // The prompt's ids: --prompt-ids as given, or --prompt's text through the
  // tokenizer of `tokenizer_class` (Model::tokenizer_class,
  // ServerInfo.tokenizer; errors as ByteTokenizer::ForClass).
  absl::StatusOr<std::vector<uint32_t>> Ids(const std::string& tokenizer_class, int64_t vocab_size) const;
  // The generated ids as text, for a --prompt (tokenizer known to work).
  std::string Text(const std::vector<runtime::Sampled>& out) const;
};

// --temperature, --top-p, --seed.
struct SamplingFlags {
  std::string temperature, top_p;
  uint64_t seed = 0;
  void Register(FlagParser& flags);
  absl::StatusOr<runtime::Sampling> Parse() const;
};

// {"ids": [...], "logprobs": [...], "top_logprobs": [[[id, lp], ...], ...],
//  "prompt_tokens": N, "cached_tokens": N}, and "text": the generated text
// for a --prompt.
std::string GenerationJson(const std::vector<runtime::Sampled>& out, size_t prompt_tokens, size_t cached_tokens,
                           const PromptFlags& prompt);
// "id id id"
std::string IdsLine(const std::vector<runtime::Sampled>& out);
// What `kvtier run` and `kvtier generate` print: the JSON object, or for
// a --prompt the generated text then a line of the ids ("id id id"), or
// just that line. The ids line is always the last.
std::string GenerationOutput(const std::vector<runtime::Sampled>& out, size_t prompt_tokens, size_t cached_tokens,
                             const PromptFlags& prompt, bool json);

}  // namespace kvtier::cli

#endif  // KVTIER_SERVICES_CLI_GENERATION_IO_H_
