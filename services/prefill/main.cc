// kvtier-prefill: the front door. Prefills prompts over the cache tier's
// prefixes and hands them to decode workers.
#include <iostream>
#include <memory>
#include <thread>

#include <prometheus/registry.h>

#include "absl/strings/str_split.h"
#include "kvtier/kernels/parallel.h"
#include "services/common/flags.h"
#include "services/common/metrics_exposer.h"
#include "services/common/server_runner.h"
#include "services/prefill/prefill_service.h"
#include "services/serving/serving_model.h"

namespace kvtier::prefill {
namespace {

struct Flags {
  std::string listen = "0.0.0.0:7071";
  std::string model;
  std::string cache;
  std::string decode;
  std::string kv_codec = "int8";
  uint64_t tokens_per_block = 64;
  std::string metrics_listen;
  uint64_t cache_deadline_ms = 5000;
  uint64_t threads = std::max(1u, std::thread::hardware_concurrency());
};

int Run(const Flags& f) {
  auto fail = [](int code, const auto& message) {
    std::cerr << "kvtier-prefill: " << message << "\n";
    return code;
  };
  if (f.model.empty() || f.cache.empty() || f.decode.empty()) {
    return fail(2, "--model, --cache and --decode are required");
  }
  const std::optional<kernels::Codec> codec = kernels::ParseCodec(f.kv_codec);
  if (!codec) return fail(2, absl::StrCat("--kv-codec ", f.kv_codec, " is not one of bf16, fp8, int8, int4"));
  if (f.tokens_per_block < 1 || f.tokens_per_block > kernels::kMaxBlockTokens) {
    return fail(2, "--tokens-per-block must be in 1..4096");
  }
  std::vector<std::string> decoders = absl::StrSplit(f.decode, ',', absl::SkipWhitespace());
  auto shards = serving::ShardSet::Create(f.cache, absl::Milliseconds(f.cache_deadline_ms));
  if (!shards.ok()) return fail(2, absl::StrCat("--cache: ", shards.status().message()));
  std::cerr << "kvtier-prefill: loading " << f.model << std::endl;
  if (f.threads < 1 || f.threads > 1024) return fail(2, "--threads must be in 1..1024");
  kernels::SetKernelThreads(f.threads);
  auto model = serving::LoadServingModel(f.model);
  if (!model.ok()) return fail(1, model.status().message());
  auto registry = std::make_shared<prometheus::Registry>();
  auto exposer = StartMetricsExposer(f.metrics_listen, {registry});
  if (!exposer.ok()) return fail(1, exposer.status().message());
  PrefillOptions options;
  options.codec = *codec;
  options.tokens_per_block = static_cast<uint32_t>(f.tokens_per_block);
  options.cache_deadline = absl::Milliseconds(f.cache_deadline_ms);
  PrefillService service(model->model.get(), model->id, shards->get(), decoders, registry.get(), options);
  ServerOptions server_options;
  server_options.listen = f.listen;
  auto server = ServerRunner::Start(server_options, {&service});
  if (!server.ok()) return fail(1, server.status().message());
  std::cerr << "kvtier-prefill: model " << model->id << ", latents in " << f.kv_codec << ", blocks of "
            << f.tokens_per_block << ", " << (*shards)->size() << " cache shard(s), " << decoders.size()
            << " decode worker(s)" << std::endl;
  (*server)->WaitForShutdownSignal();
  std::cerr << "kvtier-prefill: stopped" << std::endl;
  return 0;
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
  flags.AddString("listen", &f.listen, "gRPC address HOST:PORT (port 0: any free port)");
  flags.AddString("model", &f.model, "DeepSeek-V2 checkpoint directory (config.json + safetensors)");
  flags.AddString("cache", &f.cache, "kvtier-cache shards, comma-separated HOST:PORT");
  flags.AddString("decode", &f.decode, "kvtier-decode workers, comma-separated HOST:PORT");
  flags.AddString("kv-codec", &f.kv_codec, "bf16|fp8|int8|int4: how latent blocks are stored");
  flags.AddUint("tokens-per-block", &f.tokens_per_block, "tokens per latent block");
  flags.AddString("metrics-listen", &f.metrics_listen, "Prometheus /metrics address HOST:PORT; empty: none");
  flags.AddUint("cache-deadline-ms", &f.cache_deadline_ms, "deadline of each call to a cache shard");
  flags.AddUint("threads", &f.threads, "threads for the model's matrix products (default: every core)");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "kvtier-prefill")) {
    return *exit;
  }
  return kvtier::prefill::Run(f);
}
