#include "services/serving/model_server.h"

#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "kvtier/kernels/parallel.h"
#include "services/common/byte_size.h"
#include "services/common/log.h"
#include "services/common/metric_family.h"
#include "services/common/metrics_exposer.h"
#include "services/common/server_runner.h"
#include "services/common/status.h"
#include "services/runtime/checkpoint.h"
#include "services/serving/sequence_blocks.h"

namespace kvtier::serving {
namespace {

// <prefix>_record_pool_bytes{state="idle"|"held"}, read at scrape time.
class RecordPoolMetrics : public prometheus::Collectable {
 public:
  RecordPoolMetrics(std::string prefix, std::shared_ptr<const RecordPool> pool)
      : prefix_(std::move(prefix)), pool_(std::move(pool)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily family =
        Family(prefix_ + "_record_pool_bytes",
               "Memory of fetched cached blocks: held by sequences, or idle and kept for reuse",
               prometheus::MetricType::Gauge);
    AddSample(family, static_cast<double>(pool_->idle_bytes()), {{"state", "idle"}});
    AddSample(family, static_cast<double>(pool_->held_bytes()), {{"state", "held"}});
    return {std::move(family)};
  }

 private:
  const std::string prefix_;
  const std::shared_ptr<const RecordPool> pool_;
};

}  // namespace

void ModelServerFlags::Register(FlagParser& flags) {
  flags.AddString("listen", &listen, "gRPC address HOST:PORT (port 0: any free port)");
  flags.AddString("model", &model, "DeepSeek-V2 checkpoint directory (config.json + safetensors)");
  flags.AddString("cache", &cache, "kvtier-cache shards, comma-separated HOST:PORT");
  flags.AddString("metrics-listen", &metrics_listen, "Prometheus /metrics address HOST:PORT; empty: none");
  flags.AddUint("cache-deadline-ms", &cache_deadline_ms, "deadline of each call to a cache shard");
  flags.AddUint("threads", &threads, "threads for the model's matrix products (0: every core)");
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

absl::StatusOr<ModelServer> StartModelServer(const std::string& program, const ModelServerFlags& f) {
  SetLogProgram(program);
  if (f.model.empty() || f.cache.empty()) return absl::InvalidArgumentError("--model and --cache are required");
  if (f.threads > 1024) return absl::InvalidArgumentError("--threads must be at most 1024");
  KVTIER_ASSIGN_OR_RETURN(const runtime::Device device, runtime::ParseDevice(f.device));
  runtime::CudaOptions cuda;
  if (!f.device_block_pool.empty()) {
    absl::StatusOr<uint64_t> bytes = ParseByteSize(f.device_block_pool);
    if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat("--device-block-pool: ", bytes.status().message()));
    cuda.block_pool_bytes = static_cast<int64_t>(std::min<uint64_t>(*bytes, INT64_MAX));
  }
  const absl::StatusOr<uint64_t> record_pool = ParseByteSize(f.record_pool);
  if (!record_pool.ok())
    return absl::InvalidArgumentError(absl::StrCat("--record-pool: ", record_pool.status().message()));
  kernels::SetKernelThreads(f.threads == 0 ? std::max(1u, std::thread::hardware_concurrency()) : f.threads);
  ModelServer s;
  // Before the first channel: the shards' (and decode workers') channels
  // carry this process's identity.
  KVTIER_RETURN_IF_ERROR(f.security.ApplyToClients());
  KVTIER_ASSIGN_OR_RETURN(s.tenants, f.security.OpenTenants());
  absl::StatusOr<std::unique_ptr<ShardSet>> shards =
      ShardSet::Create(f.cache, absl::Milliseconds(f.cache_deadline_ms), !f.no_fast_path, *record_pool);
  if (!shards.ok()) return absl::InvalidArgumentError(absl::StrCat("--cache: ", shards.status().message()));
  s.shards = std::move(*shards);
  std::cerr << program << ": loading " << f.model << " on " << f.device << std::endl;
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Checkpoint> checkpoint, runtime::Checkpoint::Open(f.model));
  KVTIER_ASSIGN_OR_RETURN(s.model, runtime::Model::Load(*checkpoint, device, cuda));
  KVTIER_ASSIGN_OR_RETURN(s.model_id, ModelId(f.model));
  s.registry = std::make_shared<prometheus::Registry>();
  s.record_pool_metrics =
      std::make_shared<RecordPoolMetrics>(absl::StrReplaceAll(program, {{"-", "_"}}), s.shards->records());
  KVTIER_ASSIGN_OR_RETURN(s.metrics,
                          StartMetricsExposer(program, f.metrics_listen, {s.registry, s.record_pool_metrics}));
  return s;
}

int ServeUntilSignal(const std::string& program, const ModelServerFlags& flags, grpc::Service* service,
                     const std::string& ready) {
  ServerOptions options;
  options.listen = flags.listen;
  options.tls = flags.security.Tls();
  options.health_listen = flags.security.health_listen;
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
  info.add_block_format_versions(kvblock::kBlockFormatVersion);
  info.set_default_namespace(default_namespace);
  return info;
}

int ExitWith(const std::string& program, const absl::Status& status) {
  std::cerr << program << ": " << status.message() << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace kvtier::serving
