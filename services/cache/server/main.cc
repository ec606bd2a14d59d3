// kvtier-cache: the tiered latent block store, served over gRPC with
// Prometheus metrics.
#include <prometheus/registry.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <sstream>

#include "absl/cleanup/cleanup.h"
#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "services/cache/fast_path/fast_path_server.h"
#include "services/cache/server/cache_service.h"
#include "services/cache/store/slab_memory.h"
#if KVTIER_HAVE_CUDA
#include "services/cache/store/cuda_slab.h"
#endif
#include "services/base/byte_size.h"
#include "services/base/flags.h"
#include "services/base/heap_reuse.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/base/usable_cpus.h"
#include "services/cache/server/store_metrics.h"
#include "services/rpc/library_logs.h"
#include "services/rpc/security_flags.h"
#include "services/rpc/tls.h"
#include "services/rpc/tls_files.h"
#include "services/server/metrics_exposer.h"
#include "services/server/server_runner.h"

namespace kvtier::cache {
namespace {

// --metrics-listen's default: --listen's host, port 9464, so that metrics
// are on every interface only where gRPC is.
constexpr char kMetricsOnListenHost[] = "LISTEN-HOST:9464";
// As the model servers cap theirs: more threads than this would only
// exhaust the process's stacks.
constexpr uint64_t kMostThreads = 1024;

struct Flags {
  std::string listen = "0.0.0.0:7070";
  std::string metrics_listen = kMetricsOnListenHost;
  std::string device_capacity;
  std::string host_capacity;
  std::string disk_dir;
  std::string disk_capacity;
  uint64_t threads = std::max(2u, UsableCpus());
  uint64_t page_size = StoreOptions{}.page_size;
  std::string namespaces;
  std::string device_memory = "auto";
  std::string fast_path_socket;
  std::string fast_path_staging = "512MiB";
  std::string fast_path_device_staging = "1GiB";
  bool no_fast_path = false;
  bool no_demote_ahead = false;
  uint64_t put_idle_ms = 30000;
  uint64_t save_on_stop_ms = 10000;
  std::string eviction = "adaptive";
  SecurityFlags security;
};

// The device tier's memory for --device-memory; null: host memory.
absl::StatusOr<std::shared_ptr<SlabMemory>> DeviceTierSlab(const std::string& kind, uint64_t bytes) {
  if (kind == "host") return nullptr;
  if (kind == "staged-host") {
    absl::StatusOr<std::unique_ptr<StagedHostSlab>> slab = StagedHostSlab::Create(bytes);
    if (!slab.ok()) return slab.status();
    return std::shared_ptr<SlabMemory>(*std::move(slab));
  }
  if (kind != "auto" && kind != "cuda") {
    return absl::InvalidArgumentError("--device-memory must be auto, cuda, host or staged-host");
  }
#if KVTIER_HAVE_CUDA
  absl::StatusOr<std::unique_ptr<CudaSlab>> slab = CudaSlab::Create(bytes);
  if (slab.ok()) return std::shared_ptr<SlabMemory>(*std::move(slab));
  // auto: no GPU here, so host memory; a GPU that fails is an error.
  if (kind == "auto" && slab.status().code() == absl::StatusCode::kFailedPrecondition) return nullptr;
  return absl::Status(slab.status().code(), absl::StrCat("--device-memory ", kind, ": ", slab.status().message()));
#else
  if (kind == "cuda") return absl::FailedPreconditionError("--device-memory cuda: this build has no CUDA");
  return nullptr;
#endif
}

absl::StatusOr<FastPathOptions> ToFastPathOptions(const Flags& f) {
  FastPathOptions o;
  KVTIER_ASSIGN_OR_RETURN(o.staging_budget, ParseByteSizeFlag("fast-path-staging", f.fast_path_staging));
  KVTIER_ASSIGN_OR_RETURN(o.device_staging_budget,
                          ParseByteSizeFlag("fast-path-device-staging", f.fast_path_device_staging));
  o.socket_path = f.fast_path_socket;
  if (o.socket_path.empty()) {
    // Abstract: nothing to clean up, reachable within this network namespace
    // (the pod), and unique even between containers that share it.
    uint64_t nonce = 0;
    (void)!getrandom(&nonce, sizeof nonce, 0);
    o.socket_path = absl::StrCat("@kvtier-cache-", getpid(), "-", absl::Hex(nonce));
  }
  return o;
}

absl::StatusOr<StoreOptions> ToStoreOptions(const Flags& f) {
  if (f.device_capacity.empty() || f.host_capacity.empty()) {
    return absl::InvalidArgumentError("--device-capacity and --host-capacity are required");
  }
  if (f.disk_dir.empty() != f.disk_capacity.empty()) {
    return absl::InvalidArgumentError("--disk-dir and --disk-capacity go together");
  }
  StoreOptions o;
  if (!f.disk_dir.empty()) {
    KVTIER_ASSIGN_OR_RETURN(o.disk_capacity, ParseByteSizeFlag("disk-capacity", f.disk_capacity));
    if (o.disk_capacity == 0) return absl::InvalidArgumentError("--disk-capacity: must be positive");
    o.disk_dir = f.disk_dir;
  }
  KVTIER_ASSIGN_OR_RETURN(const uint64_t device, ParseByteSizeFlag("device-capacity", f.device_capacity));
  KVTIER_ASSIGN_OR_RETURN(const uint64_t host, ParseByteSizeFlag("host-capacity", f.host_capacity));
  if (f.page_size < 4096 || f.page_size > (64u << 20)) {
    return absl::InvalidArgumentError("--page-size must be within 4KiB..64MiB");
  }
  o.page_size = static_cast<uint32_t>(f.page_size);
  o.shared_memory = !f.no_fast_path;
  o.demote_ahead = !f.no_demote_ahead;
  if (f.eviction == "lru") {
    o.eviction = Eviction::kLru;
  } else if (f.eviction == "leaf-first") {
    o.eviction = Eviction::kLeafFirst;
  } else if (f.eviction == "adaptive") {
    o.eviction = Eviction::kAdaptive;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--eviction ", f.eviction, " is not adaptive, leaf-first or lru"));
  }
  KVTIER_ASSIGN_OR_RETURN(o.device_slab, DeviceTierSlab(f.device_memory, device));
  o.device_capacity = device;
  o.host_capacity = host;
  // Unless the device tier is on a GPU, it is host memory too: both must fit
  // in what this process may use (a container's limit, in Kubernetes).
  const MemoryLimit memory = ProcessMemoryLimit();
  const bool on_gpu = o.device_slab != nullptr && f.device_memory != "staged-host";
  const uint64_t ram = memory.bytes;
  // In 128 bits: two sizes near 2^64 must not wrap to a small one.
  const absl::uint128 wanted = absl::uint128(host) + (on_gpu ? 0 : device);
  if (wanted > ram) {
    std::ostringstream figure;
    figure << wanted;
    return absl::InvalidArgumentError(absl::StrCat(
        on_gpu ? "--host-capacity = " : "--device-capacity + --host-capacity = ", figure.str(),
        " bytes exceeds the memory this process may use (", ram, " bytes: ",
        memory.from_cgroup ? "its cgroup's limit, a container's memory limit" : "this machine's memory", ")"));
  }
  return o;
}

constexpr uint64_t kMostSaveOnStopMs = 600000;

// After the last call: the memory tiers' blocks go down to the disk tier,
// where the next start finds them (--save-on-stop-ms).
void SaveForRestart(BlockStore& store, uint64_t ms) {
  const absl::Time start = absl::Now();
  const BlockStore::Saved saved = store.SaveForRestart(start + absl::Milliseconds(static_cast<int64_t>(ms)));
  std::string line = absl::StrCat("saved ", saved.blocks, " blocks (", saved.bytes,
                                  " bytes) of the memory tiers to the disk tier for the next start in ",
                                  absl::ToInt64Milliseconds(absl::Now() - start), " ms");
  if (saved.left_blocks > 0) {
    absl::StrAppend(&line, "; ", saved.left_blocks, " blocks (", saved.left_bytes,
                    " bytes) not saved: --save-on-stop-ms or the disk tier's room ran out");
  }
  Log(LogLevel::kInfo, "disk", line);
}

// The flags that need nothing made to check: before the tiers, as opening
// a disk tier can take long.
absl::Status CheckServingFlags(const Flags& f, const ServerOptions& server) {
  KVTIER_RETURN_IF_ERROR(ServerRunner::Check(server));
  KVTIER_RETURN_IF_ERROR(CheckMetricsAddress(f.metrics_listen));
  if (f.put_idle_ms == 0) return absl::InvalidArgumentError("--put-idle-ms must be positive");
  if (f.save_on_stop_ms > kMostSaveOnStopMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("--save-on-stop-ms ", f.save_on_stop_ms, ": must be 0 to ", kMostSaveOnStopMs));
  }
  if (f.threads < 1 || f.threads > kMostThreads) {
    return absl::InvalidArgumentError(absl::StrCat("--threads ", f.threads, ": must be 1 to ", kMostThreads));
  }
  return absl::OkStatus();
}

int Run(Flags f) {
  const auto usage = [](absl::string_view message) {
    std::cerr << "kvtier-cache: " << message << "\n";
    return 2;
  };
  if (f.metrics_listen == kMetricsOnListenHost) f.metrics_listen = f.listen.substr(0, f.listen.rfind(':')) + ":9464";
  ServerOptions server_options = ServerOptionsFor(f.listen, f.security);
  server_options.what = "kvtier-cache, which serves kvtier.v1.KvCache";
  if (absl::Status s = CheckServingFlags(f, server_options); !s.ok()) return usage(s.message());
  std::vector<std::string> namespaces;
  for (absl::string_view ns : absl::StrSplit(f.namespaces, ',', absl::SkipEmpty())) {
    if (absl::Status s = kvblock::ValidateNamespace(std::string(ns)); !s.ok()) {
      return usage(absl::StrCat("--namespaces: ", s.message()));
    }
    namespaces.emplace_back(ns);
  }
  absl::StatusOr<std::unique_ptr<TenantRegistry>> tenants = f.security.OpenTenants();
  if (!tenants.ok()) return usage(tenants.status().message());
  absl::StatusOr<FastPathOptions> fast_options = ToFastPathOptions(f);
  if (!fast_options.ok()) return usage(fast_options.status().message());
  absl::StatusOr<StoreOptions> options = ToStoreOptions(f);
  if (!options.ok()) return usage(options.status().message());
  // Put streams' read buffers are freed and taken again by the megabyte:
  // each arena keeps some for the next, a share of the tiers in host
  // memory. Under 1 GiB of them glibc keeps its own thresholds: there what
  // the arenas keep would be a large part of the process's room beyond its
  // tiers (docs/operations.md).
  const uint64_t in_host = options->host_capacity + (options->device_slab ? 0 : options->device_capacity);
  if (const uint64_t kept = std::min<uint64_t>(in_host / 256, 64 << 20);
      kept >= (4 << 20) && !KeepFreedHeapForReuse(kept)) {
    Log(LogLevel::kWarning, "heap", "the C library refused its thresholds: freed heap goes back as it decides");
  }
  // A same-host reader maps whole segments: their blocks must be of
  // namespaces the same tenants may read.
  options->segment_group = [registry = tenants->get()](const std::string& ns) { return registry->ReaderClass(ns); };
  fast_options->may_read = [registry = tenants->get()](const std::string& tenant, const std::string& ns) {
    return registry->MayRead(tenant, ns);
  };
  // Fast path sessions and streams outlive the handshake of the connection
  // that opened them: each ends once the client certificate it came with
  // no longer passes the TLS files in force (revoked, its CA dropped; a
  // session's also when it expires).
  absl::StatusOr<TlsFiles*> tls_files = ServerFiles(server_options.tls);
  if (!tls_files.ok()) return usage(tls_files.status().message());
  if (*tls_files != nullptr) fast_options->trust = [files = *tls_files] { return files->trust(); };
  if (!options->disk_dir.empty()) Log(LogLevel::kInfo, "disk", "finding the blocks in " + options->disk_dir);
  const absl::Time creating = absl::Now();
  absl::StatusOr<std::unique_ptr<BlockStore>> store = BlockStore::Create(*options, SystemClock::Get());
  if (!store.ok()) return usage(store.status().message());
  const absl::Duration created = absl::Now() - creating;
  // The blocks it found are held to their tenants' quotas before their
  // Puts, and a quota changed in the tenants file holds once calls see it.
  const auto give_quotas = [store = store->get(),
                            tiers = (*store)->Stats().tiers](const TenantRegistry::TenantList& tenants) {
    std::vector<std::pair<std::string, OwnerQuota>> quotas;
    for (const auto& tenant : tenants) quotas.emplace_back(tenant->tenant, ToOwnerQuota(tenant->quota));
    store->SetQuotas(quotas);
    for (const std::string& warning : OvercommittedQuotas(quotas, tiers)) {  // capacities: fixed at Create
      Log(LogLevel::kWarning, "tenants", warning);
    }
  };
  give_quotas((*tenants)->Tenants());
  std::unique_ptr<FastPathServer> fast_path;
  if (!f.no_fast_path) {
    absl::StatusOr<std::unique_ptr<FastPathServer>> started =
        FastPathServer::Start(*fast_options, store->get(), SystemClock::Get());
    if (!started.ok()) return usage(absl::StrCat("--fast-path-socket: ", started.status().message()));
    fast_path = *std::move(started);
  }
  // A tenant taken out of the file keeps no fast path session (nor the
  // staging memory and pinned blocks it holds), and one whose right to
  // write changed gets new ones (with staging or without, as it may write);
  // one whose maxSessions went under what it holds keeps its oldest.
  (*tenants)->OnReload([give_quotas, fast_path = fast_path.get()](const TenantRegistry::TenantList& tenants) {
    give_quotas(tenants);
    if (fast_path == nullptr) return;
    for (const std::string& why : fast_path->KeepTenants(tenants)) Log(LogLevel::kInfo, "tenants", why);
  });
  // Before the fast path and the store go.
  const absl::Cleanup stop_reload_hook = [&tenants] { (*tenants)->OnReload(nullptr); };
  auto registry = std::make_shared<prometheus::Registry>();
  RpcMetrics rpc_metrics(*registry);
  Executor executor(f.threads, /*max_queued=*/4096);
  IdleStreams idle_puts(absl::Milliseconds(static_cast<int64_t>(f.put_idle_ms)));
  CacheService service(store->get(), &executor, &rpc_metrics, namespaces, fast_path.get(), tenants->get(), &idle_puts);
  auto store_metrics = std::make_shared<StoreMetrics>(store->get(), fast_path.get());
  auto exposer = StartMetricsExposer("kvtier-cache", f.metrics_listen, {registry, store_metrics});
  if (!exposer.ok()) {
    std::cerr << "kvtier-cache: " << exposer.status().message() << "\n";
    return 1;
  }
  server_options.tenants = tenants->get();
  absl::StatusOr<std::unique_ptr<ServerRunner>> server = ServerRunner::Start(server_options, {&service});
  if (!server.ok()) {
    std::cerr << "kvtier-cache: " << server.status().message() << "\n";
    return server.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;  // a bad flag, or a busy port
  }
  const StoreStats stats = (*store)->Stats();
  // Said in one write: std::cerr writes each piece at once, and a parent
  // printing beside it (kvtier up) would cut the line.
  std::ostringstream started;
  started << "kvtier-cache: device tier " << options->device_capacity << " bytes in "
          << (options->device_slab != nullptr ? options->device_slab->name() : "host memory") << ", host tier "
          << options->host_capacity << " bytes, pages of " << options->page_size << " bytes";
  if (!options->disk_dir.empty()) {
    started << ", disk tier " << options->disk_capacity << " bytes in " << options->disk_dir << " ("
            << stats.tiers.back().blocks << " blocks found; tiers ready in " << absl::ToInt64Milliseconds(created)
            << " ms)";
  }
  if (fast_path != nullptr) {
    started << "; same-host fast path on " << fast_path->socket_path()
            << (options->device_slab != nullptr ? " (host tier in shared memory)" : " (tiers in shared memory)");
  } else {
    started << "; no fast path";
  }
  started << "\n";
  std::cerr << started.str() << std::flush;
  (*server)->WaitForShutdownSignal();
  if (fast_path != nullptr) fast_path->Stop();
  if (!options->disk_dir.empty() && f.save_on_stop_ms > 0) SaveForRestart(**store, f.save_on_stop_ms);
  std::cerr << "kvtier-cache: stopped" << std::endl;
  return 0;
}

}  // namespace
}  // namespace kvtier::cache

int main(int argc, char** argv) {
  kvtier::SetLogProgram("kvtier-cache");
  kvtier::RouteLibraryLogs();
  kvtier::BlockShutdownSignals();
  kvtier::cache::Flags f;
  kvtier::FlagParser flags("kvtier-cache --device-capacity SIZE --host-capacity SIZE [flags]",
                           "Serves kvtier.v1.KvCache: a tiered store of quantized MLA latent blocks.\n"
                           "Full tiers demote blocks (the choice: --eviction) to the next tier; the last drops\n"
                           "them (the disk tier, when configured, is last). Without a GPU the device tier\n"
                           "is host memory. SIZE: bytes or 512MiB, 4GiB, 4Gi, 1.5GiB.\n"
                           "Stops gracefully on SIGTERM.");
  flags.AddString("listen", &f.listen, "gRPC address HOST:PORT (port 0: any free port)");
  flags.AddString("metrics-listen", &f.metrics_listen,
                  "Prometheus /metrics address HOST:PORT (default: --listen's host, port 9464); empty to disable");
  flags.AddString("device-capacity", &f.device_capacity, "bytes of the device tier");
  flags.AddString("host-capacity", &f.host_capacity, "bytes of the host (CPU spill) tier");
  flags.AddString("disk-dir", &f.disk_dir,
                  "directory of the disk tier, one cache's at a time; a restart finds its blocks again, and those "
                  "of the memory tiers that --save-on-stop-ms moved there");
  flags.AddString("disk-capacity", &f.disk_capacity, "bytes of block records under --disk-dir");
  flags.AddUint("threads", &f.threads, "worker threads for Put and Get (1 to 1024)");
  flags.AddString("namespaces", &f.namespaces, "comma-separated tenants to serve (others get NOT_FOUND); empty: any");
  flags.AddUint("page-size", &f.page_size, "tier page size in bytes");
  flags.AddString("device-memory", &f.device_memory,
                  "where the device tier lives: auto (a GPU if there is one, else host memory), cuda, host, "
                  "or staged-host (host memory reached by copies, as a GPU's is: for testing)");
  flags.AddString(
      "fast-path-socket", &f.fast_path_socket,
      "unix socket of the same-host fast path, '@name' for an abstract one (default: a fresh abstract name)");
  flags.AddString("fast-path-staging", &f.fast_path_staging,
                  "staging memory for same-host Put, all sessions together (0: none)");
  flags.AddString("fast-path-device-staging", &f.fast_path_device_staging,
                  "GPU memory, beyond --device-capacity, for same-host GPU clients to read the GPU tier's blocks "
                  "through, all sessions together (0: none; only with the device tier on a GPU)");
  flags.AddBool("no-fast-path", &f.no_fast_path,
                "serve blocks over gRPC only: tiers in private memory, no unix socket");
  flags.AddBool("no-demote-ahead", &f.no_demote_ahead,
                "demote only when a tier is asked for room it lacks (by default a tier with one below keeps a "
                "64th of itself, at most a quarter of the tier below, free by demoting on a thread of its own, "
                "so a Put does not wait for a demotion's copy)");
  flags.AddString("eviction", &f.eviction,
                  "which blocks a full tier gives up first: adaptive (leaf-first, but blocks stored and not used "
                  "since go first while they hold more than a share of the tier that follows what comes back "
                  "after eviction: one-off prompts do not push out what is reused; and where memory is scarce, "
                  "blocks used far more often, such as shared system prompts, stay ahead of more recent ones as "
                  "far as what comes back says they should), leaf-first (the least "
                  "recently used, but a Match or Get refreshes a prefix last block first, so its first blocks, "
                  "which every longer prefix needs, go last), or lru (each block by its own last use)");
  flags.AddUint("put-idle-ms", &f.put_idle_ms,
                "a Put stream that stores no slice for this long (messages without one do not count) is ended "
                "(DEADLINE_EXCEEDED) and its incomplete blocks dropped");
  flags.AddUint("save-on-stop-ms", &f.save_on_stop_ms,
                "with --disk-dir: after SIGTERM, once the last call has ended, the longest the cache spends moving "
                "the memory tiers' blocks to the disk tier, the most recently used first, so that its next start "
                "finds them (0 to 600000; 0: they are lost at stop)");
  f.security.Register(flags, /*serves=*/true, /*calls=*/false);
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "kvtier-cache"))
    return *exit;
  return kvtier::cache::Run(f);
}
