// `kvtier generate`: one generation through a prefill node. Last stdout
// line: the generated ids; or, with --json, the object `kvtier run` prints,
// with the cached prompt tokens the cache supplied.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/base/flags.h"
#include "services/cli/commands.h"
#include "services/cli/generation_io.h"
#include "services/cli/remote_generate.h"
#include "services/rpc/client_identity.h"
#include "services/rpc/security_flags.h"

namespace kvtier::cli {

int RunGenerate(const std::vector<std::string>& args) {
  std::string target, ns, request_id;
  PromptFlags prompt_flags;
  uint64_t max_new = 16, top_logprobs = 5, deadline_ms = 600000;
  SecurityFlags security;
  SamplingFlags sampling_flags;
  bool json = false;
  FlagParser flags("kvtier generate --target ADDR (--prompt-ids 1,2,3 | --prompt TEXT) --max-new-tokens N [flags]",
                   "Generates through a prefill node (kvtier-prefill), which reuses the cache's\n"
                   "prefix, prefills the rest and hands decoding to a decode worker. Greedy\n"
                   "unless --temperature is given. Usage (cached tokens, time to first token) goes\n"
                   "to stderr. A --prompt is tokenized with the tokenizer the server's Info names.");
  flags.AddString("target", &target, "the prefill node, HOST:PORT");
  prompt_flags.Register(flags);
  flags.AddUint("max-new-tokens", &max_new, "tokens to generate");
  flags.AddBool("json", &json, "print {ids, logprobs, top_logprobs, prompt_tokens, cached_tokens}");
  flags.AddString("namespace", &ns, "tenant whose cached prefixes may be reused (default: \"default\")");
  flags.AddString("request-id", &request_id, "id for the servers' logs");
  flags.AddUint("top-logprobs", &top_logprobs, "alternatives reported per token (0-20)");
  flags.AddUint("deadline-ms", &deadline_ms, "the whole generation's deadline (DEADLINE_EXCEEDED past it)");
  sampling_flags.Register(flags);
  security.Register(flags, /*serves=*/false, /*calls=*/true);
  if (std::optional<int> exit = flags.ParseOrExit(args, "kvtier generate")) return *exit;
  auto fail = [](const absl::Status& s) {
    std::cerr << "kvtier generate: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << ConnectionHint(s)
              << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  };
  if (target.empty()) return fail(absl::InvalidArgumentError("--target is required"));
  if (deadline_ms == 0) return fail(absl::InvalidArgumentError("--deadline-ms must be positive"));
  if (absl::Status s = security.ApplyToClients(); !s.ok()) return fail(s);
  if (absl::Status s = prompt_flags.Check(); !s.ok()) return fail(s);
  // Text needs the server's tokenizer; ids need no call.
  v1::ServerInfo info;
  if (!prompt_flags.text.empty()) {
    absl::StatusOr<v1::ServerInfo> got = PrefillInfo(target, absl::Milliseconds(static_cast<int64_t>(deadline_ms)));
    if (!got.ok()) return fail(got.status());
    info = *std::move(got);
  }
  auto prompt = prompt_flags.Ids(info.tokenizer(), info.vocab_size());
  if (!prompt.ok()) return fail(prompt.status());
  auto sampling = sampling_flags.Parse();
  if (!sampling.ok()) return fail(sampling.status());
  v1::GenerateRequest request;
  request.set_request_id(request_id);
  request.set_kv_namespace(ns);
  for (uint32_t id : *prompt) request.add_prompt_token_ids(id);
  request.mutable_sampling()->set_temperature(sampling->temperature);
  request.mutable_sampling()->set_top_p(sampling->top_p);
  request.mutable_sampling()->set_seed(sampling->seed);
  request.mutable_limits()->set_max_new_tokens(static_cast<uint32_t>(std::min<uint64_t>(max_new, UINT32_MAX)));
  request.mutable_limits()->set_top_logprobs(static_cast<uint32_t>(std::min<uint64_t>(top_logprobs, UINT32_MAX)));
  absl::StatusOr<RemoteGeneration> out =
      GenerateRemotely(target, request, absl::Milliseconds(static_cast<int64_t>(deadline_ms)));
  if (!out.ok()) return fail(out.status());
  std::cerr << absl::StrFormat(
      "kvtier generate: %zu tokens (%s), prompt %u tokens of which %u cached, first token after %.1f ms\n",
      out->tokens.size(), v1::FinishReason_Name(out->reason), out->usage.prompt_tokens(), out->usage.cached_tokens(),
      out->usage.time_to_first_token_us() / 1e3);
  std::cout << GenerationOutput(out->tokens, out->usage.prompt_tokens(), out->usage.cached_tokens(), prompt_flags, json)
            << "\n";
  return 0;
}

}  // namespace kvtier::cli
