// kvtier-decode: the decode worker. Pulls sequences' latent blocks from the
// cache shards and decodes them with absorbed MLA on the quantized latents,
// batching the steps of all its sequences.
#include <iostream>
#include <memory>
#include <thread>

#include <prometheus/registry.h>

#include "kvtier/kernels/parallel.h"
#include "services/common/flags.h"
#include "services/common/metrics_exposer.h"
#include "services/common/server_runner.h"
#include "services/decode/decode_service.h"
#include "services/serving/serving_model.h"

namespace kvtier::decode {
namespace {

struct Flags {
  std::string listen = "0.0.0.0:7072";
  std::string model;
  std::string cache;
  std::string metrics_listen;
  uint64_t max_batch = 32;
  uint64_t max_sequences = 256;
  uint64_t cache_deadline_ms = 5000;
  uint64_t threads = std::max(1u, std::thread::hardware_concurrency());
};

int Run(const Flags& f) {
  auto fail = [](int code, const auto& message) {
    std::cerr << "kvtier-decode: " << message << "\n";
    return code;
  };
  if (f.model.empty() || f.cache.empty()) return fail(2, "--model and --cache are required");
  if (f.max_batch < 1 || f.max_sequences < 1) return fail(2, "--max-batch and --max-sequences must be positive");
  auto shards = serving::ShardSet::Create(f.cache, absl::Milliseconds(f.cache_deadline_ms));
  if (!shards.ok()) return fail(2, absl::StrCat("--cache: ", shards.status().message()));
  std::cerr << "kvtier-decode: loading " << f.model << std::endl;
  if (f.threads < 1 || f.threads > 1024) return fail(2, "--threads must be in 1..1024");
  kernels::SetKernelThreads(f.threads);
  auto model = serving::LoadServingModel(f.model);
  if (!model.ok()) return fail(1, model.status().message());
  auto registry = std::make_shared<prometheus::Registry>();
  auto exposer = StartMetricsExposer(f.metrics_listen, {registry});
  if (!exposer.ok()) return fail(1, exposer.status().message());
  DecodeService service(model->model.get(), model->id, shards->get(), registry.get(),
                        {.max_batch = f.max_batch, .max_sequences = f.max_sequences});
  ServerOptions options;
  options.listen = f.listen;
  auto server = ServerRunner::Start(options, {&service});
  if (!server.ok()) return fail(1, server.status().message());
  std::cerr << "kvtier-decode: model " << model->id << ", " << (*shards)->size() << " cache shard(s), batches of up to "
            << f.max_batch << std::endl;
  (*server)->WaitForShutdownSignal();
  std::cerr << "kvtier-decode: stopped" << std::endl;
  return 0;
}

}  // namespace
}  // namespace kvtier::decode

int main(int argc, char** argv) {
  kvtier::BlockShutdownSignals();
  kvtier::decode::Flags f;
  kvtier::FlagParser flags("kvtier-decode --model DIR --cache ADDR[,ADDR...] [flags]",
                           "Serves kvtier.v1.Decode: continues sequences whose latent blocks live in the\n"
                           "cache shards, with absorbed MLA attention over the quantized latents, all\n"
                           "sequences' steps batched together. Blocks that fill are written back.\n"
                           "Stops gracefully on SIGTERM.");
  flags.AddString("listen", &f.listen, "gRPC address HOST:PORT (port 0: any free port)");
  flags.AddString("model", &f.model, "DeepSeek-V2 checkpoint directory (config.json + safetensors)");
  flags.AddString("cache", &f.cache, "kvtier-cache shards, comma-separated HOST:PORT");
  flags.AddString("metrics-listen", &f.metrics_listen, "Prometheus /metrics address HOST:PORT; empty: none");
  flags.AddUint("max-batch", &f.max_batch, "sequences per decode step");
  flags.AddUint("max-sequences", &f.max_sequences, "sequences held at once; more get RESOURCE_EXHAUSTED");
  flags.AddUint("cache-deadline-ms", &f.cache_deadline_ms, "deadline of each call to a cache shard");
  flags.AddUint("threads", &f.threads, "threads for the model's matrix products (default: every core)");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "kvtier-decode")) {
    return *exit;
  }
  return kvtier::decode::Run(f);
}
