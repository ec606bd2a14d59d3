#include "services/serving/model_server.h"

#include <iostream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "kvtier/kernels/parallel.h"
#include "services/base/byte_size.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/base/usable_cpus.h"
#include "services/rpc/library_logs.h"
#include "services/runtime/checkpoint.h"
#include "services/server/metric_family.h"
#include "services/server/metrics_exposer.h"
#include "services/server/server_runner.h"
#include "services/serving/sequence_blocks.h"

namespace kvtier::serving {
namespace {

// The shards' health and their record pool, read at scrape time.
class ShardSetMetrics : public prometheus::Collectable {
 public:
  ShardSetMetrics(std::string prefix, const cache::ShardSet* shards) : prefix_(std::move(prefix)), shards_(shards) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily up =
        Family(prefix_ + "_cache_shard_up",
               "1 when the cache shard passed its last health check, 0 when it failed it or was not checked yet",
               prometheus::MetricType::Gauge);
    prometheus::MetricFamily shards =
        Family(prefix_ + "_cache_shards", "Cache shards known, by the state of their last health check",
               prometheus::MetricType::Gauge);
    std::map<std::string, double> states{{"up", 0}, {"down", 0}, {"unknown", 0}};
    for (const auto& [target, health] : shards_->HealthOfShards()) {
      AddSample(up, health == cache::ShardSet::Health::kUp ? 1 : 0, {{"shard", target}});
      ++states[health == cache::ShardSet::Health::kUp     ? "up"
               : health == cache::ShardSet::Health::kDown ? "down"
                                                          : "unknown"];
    }
    for (const auto& [state, count] : states) AddSample(shards, count, {{"state", state}});
    prometheus::MetricFamily pool =
        Family(prefix_ + "_record_pool_bytes",
               "Memory of fetched cached blocks: held by sequences, or idle and kept for reuse",
               prometheus::MetricType::Gauge);
    AddSample(pool, static_cast<double>(shards_->records()->idle_bytes()), {{"state", "idle"}});
    AddSample(pool, static_cast<double>(shards_->records()->held_bytes()), {{"state", "held"}});
    return {std::move(up), std::move(shards), std::move(pool)};
  }

 private:
  const std::string prefix_;
  const cache::ShardSet* const shards_;
};

}  // namespace

void ModelServerFlags::Register(FlagParser& flags) {
  flags.AddString("listen", &listen, "gRPC address HOST:PORT (port 0: any free port)");
  flags.AddString("model", &model,
                  "checkpoint directory as its authors publish it (config.json + safetensors): DeepSeek-V2, "
                  "the V3 family (V3, R1, V3.1, Kimi-K2), V3.2 or V4");
  flags.AddString("cache", &cache,
                  "kvtier-cache shards: HOST:PORT[,HOST:PORT...], or srv:NAME to find them as DNS SRV records "
                  "(a Kubernetes headless Service's _grpc._tcp.SERVICE.NAMESPACE.svc.cluster.local), "
                  "looked up again every --watch-interval-ms");
  flags.AddString("metrics-listen", &metrics_listen, "Prometheus /metrics address HOST:PORT; empty: none");
  flags.AddUint("cache-deadline-ms", &cache_deadline_ms, "deadline of each call to a cache shard");
  flags.AddUint("cache-fetch-streams", &cache_fetch_streams,
                "gRPC streams at once (1 to 4, each on a connection of its own) that read a prefix's blocks of "
                "one cache shard, each 8 MiB or more: one connection carries about what one core receives and "
                "decrypts; 0: one for every four cores this process may use");
  flags.AddUint("watch-interval-ms", &watch_interval_ms,
                "how often srv: names are looked up again and each cache shard's health is checked");
  flags.AddString("dns-server", &dns_server, "DNS server IPv4:PORT for srv: names; empty: the system's resolvers");
  flags.AddUint("threads", &threads,
                "threads for the model's matrix products (0: every core this process may use: its CPU affinity, "
                "and its cgroup's CPU quota such as a Kubernetes CPU limit)");
  flags.AddBool("no-fast-path", &no_fast_path,
                "read and write blocks over gRPC only, even with a cache shard on this host");
  flags.AddString("device", &device, runtime::kDeviceFlagHelp);
  flags.AddString("record-pool", &record_pool,
                  "memory of fetched cached blocks kept for reuse once no sequence holds them, e.g. 512MiB "
                  "(0: none; landing a prefix in fresh memory costs page faults)");
  flags.AddString("device-block-pool", &device_block_pool,
                  "with --device cuda: GPU memory that keeps sequences' blocks between passes, e.g. 8GiB "
                  "(0: none, every pass copies them up; default: 40% of the GPU memory free at the first pass)");
  security.Register(flags, /*serves=*/true, /*calls=*/true);
}

PeerDiscovery::Options ModelServerFlags::Discovery() const {
  return {.interval = absl::Milliseconds(watch_interval_ms), .dns_server = dns_server};
}

absl::StatusOr<ModelServer> StartModelServer(const std::string& program, const ModelServerFlags& f,
                                             const std::function<absl::Status(const runtime::ModelConfig&)>& check) {
  SetLogProgram(program);
  RouteLibraryLogs();
  if (f.model.empty() || f.cache.empty()) return absl::InvalidArgumentError("--model and --cache are required");
  if (f.threads > 1024) return absl::InvalidArgumentError("--threads must be at most 1024");
  if (f.watch_interval_ms == 0) return absl::InvalidArgumentError("--watch-interval-ms must be positive");
  if (absl::Status s = cache::ShardSet::CheckFetchStreams(f.cache_fetch_streams); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--cache-fetch-streams ", s.message()));
  }
  // Before the model loads, which can take minutes: a mistake in how it
  // will be served is said at once.
  KVTIER_RETURN_IF_ERROR(ServerRunner::Check(ServerOptionsFor(f.listen, f.security)));
  KVTIER_RETURN_IF_ERROR(CheckMetricsAddress(f.metrics_listen));
  KVTIER_ASSIGN_OR_RETURN(const runtime::Device device, runtime::ParseDevice(f.device));
  runtime::CudaOptions cuda;
  if (!f.device_block_pool.empty()) {
    KVTIER_ASSIGN_OR_RETURN(const uint64_t bytes, ParseByteSizeFlag("device-block-pool", f.device_block_pool));
    cuda.block_pool_bytes = static_cast<int64_t>(std::min<uint64_t>(bytes, INT64_MAX));
  }
  KVTIER_ASSIGN_OR_RETURN(const uint64_t record_pool, ParseByteSizeFlag("record-pool", f.record_pool));
  // Its config and tensor index, not yet its weights: before the shards,
  // so that a wrong --model is said before their connections are.
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Checkpoint> checkpoint, runtime::Checkpoint::Open(f.model));
  if (check) KVTIER_RETURN_IF_ERROR(check(checkpoint->config()));
  const unsigned threads = f.threads == 0 ? UsableCpus() : static_cast<unsigned>(f.threads);
  kernels::SetKernelThreads(threads);
  Log(LogLevel::kInfo, "threads",
      absl::StrCat(threads, " for the model's products", f.threads == 0 ? " (the CPUs this process may use)" : "",
                   "; the machine has ", std::thread::hardware_concurrency(), " cores"));
  ModelServer s;
  // Before the first channel: the shards' (and decode workers') channels
  // carry this process's identity.
  KVTIER_RETURN_IF_ERROR(f.security.ApplyToClients());
  KVTIER_ASSIGN_OR_RETURN(s.tenants, f.security.OpenTenants());
  s.shards = std::make_unique<cache::ShardSet>(absl::Milliseconds(f.cache_deadline_ms), !f.no_fast_path, record_pool,
                                               f.cache_fetch_streams);
  cache::ShardSet* shards = s.shards.get();
  absl::StatusOr<std::unique_ptr<PeerDiscovery>> discovery =
      PeerDiscovery::Start("cache shards", f.cache, f.Discovery(), [shards](const std::vector<std::string>& targets) {
        if (absl::Status set = shards->SetTargets(targets); !set.ok())
          Log(LogLevel::kWarning, "discovery", set.ToString());
      });
  if (!discovery.ok()) return absl::InvalidArgumentError(absl::StrCat("--cache: ", discovery.status().message()));
  s.cache_discovery = std::move(*discovery);
  s.shards->StartHealthChecks(absl::Milliseconds(f.watch_interval_ms));
  std::cerr << program << ": loading " << f.model << " on " << f.device << std::endl;
  KVTIER_ASSIGN_OR_RETURN(s.model, runtime::Model::Load(*checkpoint, device, cuda));
  KVTIER_ASSIGN_OR_RETURN(s.model_id, ModelId(f.model, checkpoint->config().model_type));
  s.registry = std::make_shared<prometheus::Registry>();
  s.shard_metrics = std::make_shared<ShardSetMetrics>(absl::StrReplaceAll(program, {{"-", "_"}}), s.shards.get());
  KVTIER_ASSIGN_OR_RETURN(s.metrics, StartMetricsExposer(program, f.metrics_listen, {s.registry, s.shard_metrics}));
  return s;
}

int ServeUntilSignal(const std::string& program, const ModelServerFlags& flags, grpc::Service* service,
                     const char* service_name, TenantRegistry* tenants, const std::string& ready) {
  ServerOptions options = ServerOptionsFor(flags.listen, flags.security);
  options.tenants = tenants;
  options.what = absl::StrCat(program, ", which serves ", service_name);
  absl::StatusOr<std::unique_ptr<ServerRunner>> server = ServerRunner::Start(options, {service});
  if (!server.ok()) return ExitWith(program, server.status());
  std::cerr << program << ": " << ready << std::endl;
  (*server)->WaitForShutdownSignal();
  std::cerr << program << ": stopped" << std::endl;
  return 0;
}

v1::ServerInfo ServerInfoFor(const std::string& program, const runtime::Model& model, const std::string& model_id,
                             const std::vector<kvblock::LatentLayout>& layouts, const std::string& default_namespace) {
  v1::ServerInfo info;
  info.set_server_version(VersionOf(program));
  info.set_model_id(model_id);
  for (const kvblock::LatentLayout& layout : layouts) {
    v1::LatentLayout* p = info.add_layouts();
    *p = kvblock::LayoutToProto(layout);
    if (layout.tokens_per_block == 0) p->set_layout_id(0);  // any block size: no one layout
  }
  const runtime::ModelConfig& c = model.config();
  info.set_vocab_size(static_cast<uint32_t>(c.vocab_size));
  info.set_max_context_tokens(static_cast<uint32_t>(c.max_position_embeddings));
  if (!layouts.empty()) info.add_block_format_versions(layouts.front().block_format_version);  // the model's
  info.set_default_namespace(default_namespace);
  info.set_tokenizer(model.tokenizer_class());
  return info;
}

int ExitWith(const std::string& program, const absl::Status& status) {
  std::cerr << program << ": " << status.message() << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace kvtier::serving
