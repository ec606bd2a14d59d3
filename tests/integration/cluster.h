// The serving stack as users run it, for integration tests: the real
// kvtier-cache, kvtier-decode and kvtier-prefill binaries on free loopback
// ports. Needs KVTIER_CACHE_BINARY, KVTIER_DECODE_BINARY and
// KVTIER_PREFILL_BINARY defined.
#ifndef KVTIER_TESTS_INTEGRATION_CLUSTER_H_
#define KVTIER_TESTS_INTEGRATION_CLUSTER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/v1/prefill.grpc.pb.h"
#include "services/base/child_process.h"
#include "services/cache/client/cache_client.h"
#include "services/cli/remote_generate.h"
#include "services/rpc/client_identity.h"

namespace kvtier {

// Tokens per latent block of a Cluster's prefill node.
inline constexpr uint32_t kClusterBlock = 64;

inline std::string Address(ChildProcess& p) {
  const int port = p.WaitForListeningPort();
  return port > 0 ? "127.0.0.1:" + std::to_string(port) : "";
}

// Cache shards, decode workers and one prefill node on free ports, serving
// the checkpoint in `model_dir` (bf16 latents, blocks of kClusterBlock).
class Cluster {
 public:
  // `model_flags` go to the decode workers and the prefill node,
  // `prefill_flags` to the prefill node alone.
  Cluster(const std::string& model_dir, int caches, int decoders, std::vector<std::string> cache_flags = {},
          std::string deadline_ms = "2000", std::vector<std::string> model_flags = {},
          std::vector<std::string> prefill_flags = {}) {
    std::string cache_list, decode_list;
    for (int i = 0; i < caches; ++i) {
      std::vector<std::string> argv = {KVTIER_CACHE_BINARY,
                                       "--listen",
                                       "127.0.0.1:0",
                                       "--metrics-listen",
                                       "127.0.0.1:0",
                                       "--device-capacity",
                                       "16MiB",
                                       "--host-capacity",
                                       "16MiB"};
      argv.insert(argv.end(), cache_flags.begin(), cache_flags.end());
      this->caches.push_back(Start(argv, cache_metrics.emplace_back(), cache_targets.emplace_back()));
      cache_list += (i ? "," : "") + cache_targets.back();
    }
    for (int i = 0; i < decoders; ++i) {
      std::vector<std::string> argv = {
          KVTIER_DECODE_BINARY, "--listen",    "127.0.0.1:0",         "--model", model_dir, "--cache", cache_list,
          "--metrics-listen",   "127.0.0.1:0", "--cache-deadline-ms", "2000"};
      argv.insert(argv.end(), model_flags.begin(), model_flags.end());
      this->decoders.push_back(Start(argv, decode_metrics.emplace_back(), decode_targets.emplace_back()));
      decode_list += (i ? "," : "") + decode_targets.back();
    }
    std::vector<std::string> argv = {KVTIER_PREFILL_BINARY,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--model",
                                     model_dir,
                                     "--cache",
                                     cache_list,
                                     "--decode",
                                     decode_list,
                                     "--kv-codec",
                                     "bf16",
                                     "--tokens-per-block",
                                     std::to_string(kClusterBlock),
                                     "--cache-deadline-ms",
                                     deadline_ms,
                                     "--metrics-listen",
                                     "127.0.0.1:0"};
    argv.insert(argv.end(), model_flags.begin(), model_flags.end());
    argv.insert(argv.end(), prefill_flags.begin(), prefill_flags.end());
    prefill = Start(argv, prefill_metrics, prefill_target);
  }
  bool ok() const {
    for (const auto& t : cache_targets)
      if (t.empty()) return false;
    for (const auto& t : decode_targets)
      if (t.empty()) return false;
    return !prefill_target.empty();
  }
  absl::StatusOr<cli::RemoteGeneration> Generate(const v1::GenerateRequest& r) {
    return cli::GenerateRemotely(prefill_target, r, absl::Minutes(5));
  }
  v1::StatsResponse CacheStats(size_t shard) {
    return *cache::CacheClient(MakeChannel(cache_targets[shard]), absl::Seconds(5)).Stats();
  }

  // Starts a server; its metrics and gRPC addresses ("" where it printed
  // none).
  static std::unique_ptr<ChildProcess> Start(std::vector<std::string> argv, std::string& metrics, std::string& target) {
    auto process = std::make_unique<ChildProcess>(std::move(argv));
    const std::optional<std::string> line = process->WaitForLine("metrics on ");
    metrics = line ? line->substr(0, line->find('/')) : "";
    target = Address(*process);
    return process;
  }

  std::vector<std::unique_ptr<ChildProcess>> caches, decoders;
  std::unique_ptr<ChildProcess> prefill;
  std::vector<std::string> cache_targets, cache_metrics, decode_targets, decode_metrics;
  std::string prefill_target, prefill_metrics;
};

}  // namespace kvtier

#endif  // KVTIER_TESTS_INTEGRATION_CLUSTER_H_
