// kvtier-prefill: the front door. Prefills prompts over the cache tier's
// prefixes and hands them to decode workers.
#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/base/flags.h"
#include "services/base/peer_discovery.h"
#include "services/prefill/prefill_service.h"
#include "services/runtime/v4_cache_parts.h"
#include "services/server/server_runner.h"
#include "services/serving/model_server.h"

namespace kvtier::prefill {
namespace {

struct Flags {
  serving::ModelServerFlags server;
  std::string decode;
  std::string kv_codec;  // empty: int8, or a DeepSeek-V4 model's own fp8
  uint64_t tokens_per_block = 64;
  uint64_t decode_idle_ms = 30000;
  uint64_t max_top_logprobs = serving::kMaxTopLogprobs;
  uint64_t max_generations_per_tenant = PrefillOptions{}.max_generations_per_tenant;
  uint64_t max_generations_per_client = PrefillOptions{}.max_generations_per_client;
  uint64_t max_concurrent_prefills = PrefillOptions{}.max_concurrent_prefills;
  uint64_t restore_every = PrefillOptions{}.restore_every;
};

int Run(const Flags& f) {
  const std::string program = "kvtier-prefill";
  auto usage = [&](const std::string& message) {
    return serving::ExitWith(program, absl::InvalidArgumentError(message));
  };
  if (f.decode.empty()) return usage("--decode is required");
  if (f.decode_idle_ms == 0) return usage("--decode-idle-ms must be positive");
  if (f.max_generations_per_tenant == 0 || f.max_generations_per_client == 0) {
    return usage("--max-generations-per-tenant and --max-generations-per-client must be positive");
  }
  if (f.max_concurrent_prefills == 0 || f.max_concurrent_prefills > 1024) {
    return usage("--max-concurrent-prefills must be in 1..1024");
  }
  const std::optional<kernels::Codec> codec = kernels::ParseCodec(f.kv_codec.empty() ? "int8" : f.kv_codec);
  if (!codec) return usage(absl::StrCat("--kv-codec ", f.kv_codec, " is not one of bf16, fp8, int8, int4"));
  if (f.tokens_per_block < 1 || f.tokens_per_block > kernels::kMaxBlockTokens) {
    return usage("--tokens-per-block must be in 1..4096");
  }
  // Before the model loads: a usage error should not wait for it.
  if (absl::Status valid = PeerDiscovery::Validate(f.decode, f.server.Discovery()); !valid.ok()) {
    return usage(absl::StrCat("--decode: ", valid.message()));
  }
  // What only the model's config can tell, before its weights load.
  const auto check_config = [&f, &codec](const runtime::ModelConfig& config) -> absl::Status {
    if (config.v4.has_value()) {
      // Its window and compressed entries are stored as the model rounds
      // them (FP8, lossless); no other codec is built for them.
      if (!f.kv_codec.empty() && *codec != kernels::Codec::kFp8) {
        return absl::InvalidArgumentError(
            absl::StrCat("--kv-codec ", f.kv_codec,
                         ": a DeepSeek-V4 model's entries are stored in its own FP8 (--kv-codec fp8, or leave it "
                         "unset)"));
      }
      if (absl::Status st = runtime::CheckV4BlockTokens(config, static_cast<uint32_t>(f.tokens_per_block)); !st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--tokens-per-block: ", st.message()));
      }
    }
    if (f.max_top_logprobs > static_cast<uint64_t>(config.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("--max-top-logprobs ", f.max_top_logprobs,
                                                     " exceeds the model's vocabulary of ", config.vocab_size));
    }
    return absl::OkStatus();
  };
  absl::StatusOr<serving::ModelServer> s = serving::StartModelServer(program, f.server, check_config);
  if (!s.ok()) return serving::ExitWith(program, s.status());
  PrefillOptions options;
  options.codec = s->model->config().v4.has_value() ? kernels::Codec::kFp8 : *codec;
  options.tokens_per_block = static_cast<uint32_t>(f.tokens_per_block);
  options.cache_deadline = absl::Milliseconds(f.server.cache_deadline_ms);
  options.decode_idle = absl::Milliseconds(static_cast<int64_t>(f.decode_idle_ms));
  options.max_top_logprobs = static_cast<uint32_t>(f.max_top_logprobs);
  options.max_generations_per_tenant = f.max_generations_per_tenant;
  options.max_generations_per_client = f.max_generations_per_client;
  options.max_concurrent_prefills = f.max_concurrent_prefills;
  options.restore_every = static_cast<uint32_t>(std::min<uint64_t>(f.restore_every, UINT32_MAX));
  PrefillService service(s->model.get(), s->model_id, s->shards.get(), s->registry.get(), options);
  std::atomic<size_t> decoders = 0;  // the discovery's thread updates it
  absl::StatusOr<std::unique_ptr<PeerDiscovery>> discovery = PeerDiscovery::Start(
      "decode workers", f.decode, f.server.Discovery(), [&service, &decoders](const std::vector<std::string>& targets) {
        service.SetDecoders(targets);
        decoders = targets.size();
      });
  if (!discovery.ok()) return usage(absl::StrCat("--decode: ", discovery.status().message()));
  return serving::ServeUntilSignal(
      program, f.server, &service, v1::Prefill::service_full_name(), s->tenants.get(),
      absl::StrCat("model ", s->model_id, ", latents in ", kernels::CodecName(options.codec), ", blocks of ",
                   f.tokens_per_block, ", ", s->shards->size(), " cache shard(s), ", decoders.load(),
                   " decode worker(s)"));
}

}  // namespace
}  // namespace kvtier::prefill

int main(int argc, char** argv) {
  kvtier::BlockShutdownSignals();
  kvtier::prefill::Flags f;
  kvtier::FlagParser flags("kvtier-prefill --model DIR --cache ADDR[,ADDR...] --decode ADDR[,ADDR...] [flags]",
                           "Serves kvtier.v1.Prefill: reuses the longest cached prefix of each prompt,\n"
                           "prefills the rest while streaming its new latent blocks to the cache shards\n"
                           "layer by layer, then hands the sequence to a decode worker and relays its\n"
                           "tokens. Stops gracefully on SIGTERM.");
  f.server.listen = "0.0.0.0:7071";
  f.server.Register(flags);
  flags.AddString("decode", &f.decode,
                  "kvtier-decode workers: HOST:PORT[,HOST:PORT...], or srv:NAME (DNS SRV records, as --cache)");
  flags.AddString("kv-codec", &f.kv_codec,
                  "bf16|fp8|int8|int4: how latent blocks are stored (default int8; a DeepSeek-V4 model's entries "
                  "are stored in its own FP8, fp8 only)");
  flags.AddUint("tokens-per-block", &f.tokens_per_block, "tokens per latent block");
  flags.AddUint("decode-idle-ms", &f.decode_idle_ms,
                "a decode worker that sends nothing this long is given up and the next one tried");
  flags.AddUint("max-top-logprobs", &f.max_top_logprobs,
                "most alternatives a request may ask for with each token (limits.top_logprobs), up to the "
                "vocabulary: set it to the vocabulary to score text through the servers");
  flags.AddUint("max-generations-per-tenant", &f.max_generations_per_tenant,
                "Generate calls one tenant (with --tenants) may have under way at once; more get "
                "RESOURCE_EXHAUSTED");
  flags.AddUint("max-generations-per-client", &f.max_generations_per_client,
                "Generate calls from one client address under way at once; more get RESOURCE_EXHAUSTED");
  flags.AddUint("max-concurrent-prefills", &f.max_concurrent_prefills,
                "prompts prefilled at once (each a thread); more wait their turn. A burst prefilled together "
                "reaches the decode workers together, in full batches");
  flags.AddUint("restore-every", &f.restore_every,
                "DeepSeek-V4: besides the restore point at each prompt's last block boundary, store one after every "
                "multiple of this many blocks (each costs the window's entries in every layer), so prompts that "
                "share a prefix no prompt ended at restore near its end; 0: only at prompts' ends");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "kvtier-prefill")) {
    return *exit;
  }
  return kvtier::prefill::Run(f);
}
