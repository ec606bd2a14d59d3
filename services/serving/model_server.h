// What kvtier-decode and kvtier-prefill share around their services: the
// flags both take, the start-up (kernel threads, cache shards, the
// checkpoint and its id, the metrics endpoint) and serving until SIGTERM.
#ifndef KVTIER_SERVICES_SERVING_MODEL_SERVER_H_
#define KVTIER_SERVICES_SERVING_MODEL_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvtier/v1/info.pb.h"
#include "services/base/flags.h"
#include "services/base/peer_discovery.h"
#include "services/base/version.h"
#include "services/cache/client/shard_set.h"
#include "services/kvblock/layout.h"
#include "services/rpc/security_flags.h"
#include "services/rpc/tenants.h"
#include "services/runtime/model.h"
#include "services/server/metrics_exposer.h"

namespace kvtier::serving {

struct ModelServerFlags {
  std::string listen;  // the program's default port
  std::string model;
  std::string cache;
  std::string metrics_listen;
  uint64_t cache_deadline_ms = 5000;
  uint64_t cache_fetch_streams = 0;  // 0: one for every four cores
  uint64_t watch_interval_ms = 10000;
  std::string dns_server;
  uint64_t threads = 0;  // 0: every core
  bool no_fast_path = false;
  std::string device = "cpu";
  std::string device_block_pool;  // empty: CudaOptions' default
  std::string record_pool = std::to_string(cache::ShardSet::kIdleRecordBytes >> 20) + "MiB";
  SecurityFlags security;

  // --listen --model --cache --metrics-listen --cache-deadline-ms
  // --cache-fetch-streams --watch-interval-ms --dns-server --threads --no-fast-path --device
  // --device-block-pool --record-pool, and the security flags
  // (security_flags.h)
  void Register(FlagParser& flags);

  // How --cache, and prefill's --decode, are looked up again.
  PeerDiscovery::Options Discovery() const;
};

struct ModelServer {
  std::unique_ptr<cache::ShardSet> shards;
  std::unique_ptr<PeerDiscovery> cache_discovery;  // keeps `shards` current
  std::unique_ptr<runtime::Model> model;           // the weights are copied: no checkpoint mapping kept
  std::string model_id;                            // ModelId(checkpoint dir)
  std::shared_ptr<prometheus::Registry> registry;
  std::shared_ptr<prometheus::Collectable> shard_metrics;  // the shards' health and record pool
  MetricsEndpoint metrics;                                 // no exposer with no --metrics-listen
  std::unique_ptr<TenantRegistry> tenants;                 // who may call it
};

// Checks the flags (INVALID_ARGUMENT: a usage error), sets the kernel
// threads, finds the shards (and keeps finding them, with "srv:"), starts
// their health checks, opens the checkpoint and hands its config to
// `check` (the program's own flags that depend on the model; its error is
// returned as it is), loads the weights (saying so on stderr as
// "<program>: loading DIR") and starts the metrics endpoint, which also
// reports, with <program> as the prefix ("kvtier-decode" ->
// kvtier_decode_...): <prefix>_cache_shard_up{shard},
// <prefix>_cache_shards{state} and <prefix>_record_pool_bytes{state}.
absl::StatusOr<ModelServer> StartModelServer(
    const std::string& program, const ModelServerFlags& flags,
    const std::function<absl::Status(const runtime::ModelConfig&)>& check = nullptr);

// Serves `service` (`service_name`, e.g. kvtier.v1.Prefill) on the flags'
// --listen (over --tls-dir's TLS) to the callers `tenants` admits (null:
// all) until SIGTERM: logs `ready` once listening and "<program>: stopped"
// at the end; the exit code for main.
int ServeUntilSignal(const std::string& program, const ModelServerFlags& flags, grpc::Service* service,
                     const char* service_name, TenantRegistry* tenants, const std::string& ready);

// What a decode worker or prefill node answers to Info (info.proto):
// "<program> <version>", the model, `layouts` (layout ids set where their
// tokens_per_block is), and the caller's default namespace.
v1::ServerInfo ServerInfoFor(const std::string& program, const runtime::Model& model, const std::string& model_id,
                             const std::vector<kvblock::LatentLayout>& layouts, const std::string& default_namespace);

// "<program>: <message>" on stderr; returns 2 for INVALID_ARGUMENT (a usage
// error), 1 otherwise.
int ExitWith(const std::string& program, const absl::Status& status);

}  // namespace kvtier::serving

#endif  // KVTIER_SERVICES_SERVING_MODEL_SERVER_H_
