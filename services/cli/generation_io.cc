#include "services/cli/generation_io.h"

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/base/status.h"
#include "services/runtime/tokenizer.h"

namespace kvtier::cli {
namespace {

absl::Status ParseFloat(const std::string& flag, const std::string& text, float& out) {
  if (text.empty()) return absl::OkStatus();
  if (!absl::SimpleAtof(text, &out)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " wants a number, got '", text, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> ParseIds(const std::string& text) {
  std::vector<uint32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    uint32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--prompt-ids: '", std::string(part), "' is not a token id"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--prompt-ids is empty");
  return ids;
}

void SamplingFlags::Register(FlagParser& flags) {
  flags.AddString("temperature", &temperature, "sampling temperature (0 or empty: greedy)");
  flags.AddString("top-p", &top_p, "nucleus sampling mass in (0, 1]");
  flags.AddUint("seed", &seed, "sampling seed");
}

absl::StatusOr<runtime::Sampling> SamplingFlags::Parse() const {
  runtime::Sampling s;
  s.seed = seed;
  absl::Status status = ParseFloat("temperature", temperature, s.temperature);
  if (status.ok()) status = ParseFloat("top-p", top_p, s.top_p);
  if (status.ok()) status = runtime::ValidateSampling(s);
  if (!status.ok()) return status;
  return s;
}

void PromptFlags::Register(FlagParser& flags) {
  flags.AddString("prompt-ids", &ids, "comma-separated prompt token ids");
  flags.AddString("prompt", &text,
                  "the prompt as text, through the model's tokenizer (instead of --prompt-ids); the "
                  "generated text is printed before the ids");
}

absl::Status PromptFlags::Check() const {
  if (ids.empty() == text.empty()) return absl::InvalidArgumentError("give exactly one of --prompt-ids and --prompt");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> PromptFlags::Ids(const std::string& tokenizer_class, int64_t vocab_size) const {
  KVTIER_RETURN_IF_ERROR(Check());
  if (!ids.empty()) return ParseIds(ids);
  absl::StatusOr<runtime::ByteTokenizer> tokenizer = runtime::ByteTokenizer::ForClass(tokenizer_class, vocab_size);
  if (!tokenizer.ok())
    return absl::Status(tokenizer.status().code(), absl::StrCat("--prompt: ", tokenizer.status().message()));
  return tokenizer->Encode(text);
}

std::string PromptFlags::Text(const std::vector<runtime::Sampled>& out) const {
  std::vector<uint32_t> generated;
  for (const runtime::Sampled& s : out) generated.push_back(s.token);
  return runtime::ByteTokenizer().Decode(generated);
}

std::string GenerationOutput(const std::vector<runtime::Sampled>& out, size_t prompt_tokens, size_t cached_tokens,
                             const PromptFlags& prompt, bool json) {
  if (json) return GenerationJson(out, prompt_tokens, cached_tokens, prompt);
  return prompt.text.empty() ? IdsLine(out) : absl::StrCat(prompt.Text(out), "\n", IdsLine(out));
}

std::string GenerationJson(const std::vector<runtime::Sampled>& out, size_t prompt_tokens, size_t cached_tokens,
                           const PromptFlags& prompt) {
  std::vector<std::string> ids, logprobs, tops;
  for (const runtime::Sampled& s : out) {
    ids.push_back(absl::StrCat(s.token));
    logprobs.push_back(absl::StrFormat("%.9g", s.logprob));
    std::vector<std::string> pairs;
    for (const auto& [id, lp] : s.top) pairs.push_back(absl::StrFormat("[%u, %.9g]", id, lp));
    tops.push_back(absl::StrCat("[", absl::StrJoin(pairs, ", "), "]"));
  }
  return absl::StrCat("{\"ids\": [", absl::StrJoin(ids, ", "), "], \"logprobs\": [", absl::StrJoin(logprobs, ", "),
                      "], \"top_logprobs\": [", absl::StrJoin(tops, ", "), "], \"prompt_tokens\": ", prompt_tokens,
                      ", \"cached_tokens\": ", cached_tokens,
                      prompt.text.empty() ? "" : absl::StrCat(", \"text\": ", nlohmann::json(prompt.Text(out)).dump()),
                      "}");
}

std::string IdsLine(const std::vector<runtime::Sampled>& out) {
  std::vector<std::string> ids;
  for (const auto& s : out) ids.push_back(absl::StrCat(s.token));
  return absl::StrJoin(ids, " ");
}

}  // namespace kvtier::cli
