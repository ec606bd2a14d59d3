// kvtier-cache (TCP Get and the same-host fast path) against Redis and
// memcpy, side by side in one run. Over 600 lines because every row runs
// in the same rounds as the peers it is compared with.
//
// Each client stores, then fetches, the latents of a 4,096-token prefix at
// DeepSeek-V2-Lite dims with the int8 codec: 64 blocks x 27 layers, ~1 MB a
// block, ~66 MB a client; kvtier and Redis each fetch it twice (right after
// the store, and again). kvtier: one Put stream of layer slices (a block's
// to a message, as a prefill node sends them) and one Get stream landing
// each record in the client's buffer (RawGet). Redis: the same records as
// values, pipelined SET and GET through hiredis, each GET reply copied to
// the same kind of buffer. Raw TCP: the same records on a plain socket,
// read straight into the buffer (the physical limit of a loopback fetch).
// memcpy: the same bytes, buffer to buffer. Worker load: the prefix as a decode worker or
// prefill node loads it (ShardSet::Fetch, fast path or TCP, then every
// record appended to a sequence cache). Prefill store: the prefix as a
// prefill node stores it (ShardSet::Store over TCP). All over loopback TCP,
// 1 and 4 concurrent clients; servers started by this program. The
// header names the kernel's TCP congestion control: BBR paces even a
// loopback sender, which holds Redis and the plain socket to a half or two
// thirds of what they reach under CUBIC (load/README.md), so tables taken
// under different ones do not compare. Each row also gives the CPU time of
// this program and both servers per GB moved. The rows run on a cache
// filled once first (as one in service is); that first fill, into memory
// never written, is a row of its own.
//
//   cache_bench --cache-binary build/services/kvtier-cache [--rounds 5]
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "load/bench_layout.h"
#include "load/median.h"
#include "services/base/child_process.h"
#include "services/base/flags.h"
#include "services/cache/client/cache_client.h"
#include "services/cache/client/put_wire.h"
#include "services/cache/client/raw_get.h"
#include "services/cache/client/shard_set.h"
#include "services/cache/fast_path/fast_path_client.h"
#include "services/kvblock/block_format.h"
#include "services/rpc/client_identity.h"
#include "services/rpc/grpc_status.h"
#include "services/serving/sequence_blocks.h"

namespace kvtier::cache {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kBlocks = 64;
int kRedisWindow = 1;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The kernel's TCP congestion control for new connections (a sysctl).
std::string TcpCongestionControl() {
  std::ifstream file("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string name;
  return file >> name ? name : "unknown";
}

// One client's prefix: 64 blocks, as slices and as whole records.
struct Prefix {
  std::vector<BlockSlices> slices;
  std::vector<std::string> records;
  std::vector<kvblock::BlockHash> hashes;
  size_t bytes = 0;
};

Prefix MakePrefix(const kvblock::LatentLayout& layout, const std::string& ns, uint64_t seed) {
  Prefix p;
  const size_t layer_values = layout.LayerShape().values();
  std::vector<float> x(layer_values * layout.num_layers);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  std::vector<uint32_t> tokens(kBlocks * 64);
  for (auto& t : tokens) t = static_cast<uint32_t>((s = s * 6364136223846793005ull + 1) >> 47);
  p.hashes = kvblock::ComputeBlockChain(ns, kvblock::LayoutId(layout), 64, tokens);
  for (int b = 0; b < kBlocks; ++b) {
    for (float& v : x) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      v = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / (1 << 22);
    }
    BlockSlices block{p.hashes[b], {}};
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      block.records.push_back(
          *kvblock::EncodeBlock(layout, l, 1, std::span<const float>(x).subspan(l * layer_values, layer_values)));
    }
    p.records.push_back(*kvblock::EncodeBlock(layout, 0, layout.num_layers, x));
    p.bytes += p.records.back().size();
    p.slices.push_back(std::move(block));
  }
  return p;
}

// Timing of one client's operation: started when constructed; Block() at
// each block's end records the time since the previous one.
struct Sample {
  std::vector<double> block_seconds;  // time to each block, from the previous one
  Clock::time_point last = Clock::now();

  void Block() {
    const auto now = Clock::now();
    block_seconds.push_back(Seconds(now - last));
    last = now;
  }
};

// CPU time used by this process and the servers it started, together: what
// a row costs in CPU, whichever process does the work.
class CpuClocks {
 public:
  explicit CpuClocks(const std::vector<pid_t>& servers) {
    clocks_.push_back(CLOCK_PROCESS_CPUTIME_ID);
    for (pid_t pid : servers) {
      clockid_t clock;
      if (clock_getcpuclockid(pid, &clock) == 0) {
        clocks_.push_back(clock);
      } else {
        std::fprintf(stderr, "no CPU clock for process %d: CPU s/GB leaves it out\n", static_cast<int>(pid));
      }
    }
  }
  double Seconds() const {
    double total = 0;
    for (clockid_t clock : clocks_) {
      timespec t{};
      if (clock_gettime(clock, &t) == 0) total += t.tv_sec + t.tv_nsec * 1e-9;
    }
    return total;
  }

 private:
  std::vector<clockid_t> clocks_;
};

// One round of a row: every client's sample, the wall time of the slowest,
// and the CPU time all processes used meanwhile.
struct Round {
  double wall = 0;
  double cpu = 0;
  std::vector<Sample> samples;
};

// Runs `op(client)` on `clients` threads at once.
template <typename Op>
Round Concurrently(const CpuClocks& cpu, int clients, Op op) {
  Round round;
  round.samples.resize(clients);
  std::vector<std::thread> threads;
  const double cpu_start = cpu.Seconds();
  const auto start = Clock::now();
  for (int c = 0; c < clients; ++c) threads.emplace_back([&, c] { round.samples[c] = op(c); });
  for (auto& t : threads) t.join();
  round.wall = Seconds(Clock::now() - start);
  round.cpu = cpu.Seconds() - cpu_start;
  return round;
}

// One Put stream of the prefix's layer slices, a block's slices to a
// message (as ShardedPut batches a prefill node's), each message in wire
// form over the records' own bytes (put_wire.h); with `fast`, each slice is
// written into the session's staging region and the message names it
// (inline when the region is full).
Sample KvtierPut(grpc::Channel* channel, const kvblock::LatentLayout& layout, const std::string& ns, const Prefix& p,
                 FastPathClient* fast = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::PutResponse response;
  Sample sample;
  std::optional<FastPathClient::StagedStream> staged;
  auto writer = OpenRawPut(channel, &context, &response);
  v1::PutHeader header;
  header.set_kv_namespace(ns);
  *header.mutable_layout() = kvblock::LayoutToProto(layout);
  if (fast != nullptr) {
    staged.emplace(fast);
    header.set_fast_path_session_id(fast->session_id());
  }
  writer->Write(PutHeaderMessage(header));
  PutBatchWire batch;
  for (const BlockSlices& b : p.slices) {
    for (const std::string& r : b.records) {
      if (std::optional<v1::StagedRange> range = staged.has_value() ? staged->Stage(r) : std::nullopt) {
        batch.AddStaged(b.hash, *range);
      } else {
        batch.AddInline(b.hash, Borrowed(r));  // the prefix outlives the stream
      }
    }
    writer->Write(batch.Take());
    sample.Block();
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!status.ok()) std::fprintf(stderr, "Put failed: %s\n", status.error_message().c_str());
  return sample;
}

// Where a fetch of prefix `p` lands: record i in slot i of `destination`.
// Times each block and counts those that arrived.
struct Landing {
  Landing(const Prefix& p, std::vector<uint8_t>& destination) : prefix(p), buffer(destination) {}
  RecordDestination Destination() {
    const size_t slot = prefix.records[0].size();
    return [this, slot](uint32_t index, size_t) { return std::span<uint8_t>(buffer.data() + index * slot, slot); };
  }
  std::function<void(const RawBlock&)> OnBlock() {
    return [this](const RawBlock& block) {
      sample.Block();
      landed += block.status.ok() ? 1 : 0;
    };
  }
  // Says so when the fetch failed or did not land every block.
  Sample Done(const char* what, const absl::Status& status) {
    if (!status.ok() || landed != prefix.records.size()) {
      std::fprintf(stderr, "%s failed: %s (%zu of %zu blocks)\n", what, std::string(status.message()).c_str(), landed,
                   prefix.records.size());
    }
    return std::move(sample);
  }

  const Prefix& prefix;
  std::vector<uint8_t>& buffer;
  Sample sample;
  size_t landed = 0;
};

Sample KvtierGet(grpc::Channel* channel, const kvblock::LatentLayout& layout, const std::string& ns, const Prefix& p,
                 std::vector<uint8_t>& destination) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  Landing landing(p, destination);
  const grpc::Status status =
      RawGet(channel, &context, MakeGetRequest(ns, layout, p.hashes), landing.Destination(), landing.OnBlock());
  return landing.Done("Get", FromGrpcStatus(status));
}

// The same-host fast path: lease the prefix, copy each record out of the
// cache's shared memory into the destination (what it leaves is counted
// as not landed).
Sample KvtierFastGet(FastPathClient& fast, const kvblock::LatentLayout& layout, const std::string& ns, const Prefix& p,
                     std::vector<uint8_t>& destination) {
  Landing landing(p, destination);
  const absl::StatusOr<std::vector<uint32_t>> left =
      fast.Fetch(ns, layout, p.hashes, landing.Destination(), landing.OnBlock());
  return landing.Done("fast path Get", left.status());
}

// What a decode worker or prefill node does with a cached prefix:
// ShardSet::Fetch (through the fast path, or by Get when `shards` has it
// off), then each record appended to the sequence's cache. `cache`
// is left holding the prefix, so that it is freed outside the timing.
Sample WorkerLoad(cache::ShardSet& shards, const kvblock::LatentLayout& layout, const std::string& ns, const Prefix& p,
                  runtime::SequenceCache& cache) {
  cache = serving::EmptyCache(layout);
  Sample sample;
  size_t appended = 0;
  for (const absl::StatusOr<cache::SharedRecord>& record : shards.Fetch(ns, layout, p.hashes)) {
    if (!record.ok() || !serving::AppendBlockRecord(*record, layout, cache, kvblock::CrcCheck::kCheckedBefore).ok()) {
      break;
    }
    ++appended;
  }
  if (appended != p.hashes.size()) std::fprintf(stderr, "worker load: %zu of %zu blocks\n", appended, p.hashes.size());
  return sample;
}

// What a prefill node does with a prefix it computed: the layer slices
// handed to a ShardedPut, batched into one Put stream, over TCP here.
Sample PrefillStore(cache::ShardSet& shards, const kvblock::LatentLayout& layout, const std::string& ns,
                    const Prefix& p) {
  Sample sample;
  cache::ShardedPut put(shards, ns, layout, absl::Seconds(60));
  for (const BlockSlices& b : p.slices) {
    // The prefix outlives the streams; a prefill node hands over its own.
    for (const std::string& r : b.records) put.Write(b.hash, Borrowed(r));
  }
  const size_t stored = put.Finish().size();
  if (stored != p.slices.size()) std::fprintf(stderr, "prefill store: %zu of %zu blocks\n", stored, p.slices.size());
  return sample;
}

// Whether `cache` holds the prefix's layer payloads, block for block.
void CheckLoaded(const runtime::SequenceCache& cache, const kvblock::LatentLayout& layout, const Prefix& p) {
  for (size_t b = 0; b < p.records.size(); ++b) {
    const absl::StatusOr<kvblock::BlockView> view = kvblock::ParseBlock(p.records[b], &layout);
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      const std::string_view want = view->Layer(l);
      if (b >= cache.blocks[l].size() || cache.blocks[l][b].size() != want.size() ||
          std::memcmp(cache.blocks[l][b].data(), want.data(), want.size()) != 0) {
        std::fprintf(stderr, "worker load: block %zu layer %u differs\n", b, l);
        return;
      }
    }
  }
}

Sample RedisSet(redisContext* redis, const std::string& ns, const Prefix& p) {
  Sample sample;
  for (int b = 0; b < kBlocks; ++b) {
    const std::string key = ns + kvblock::HashToHex(p.hashes[b]);
    redisAppendCommand(redis, "SET %b %b", key.data(), key.size(), p.records[b].data(), p.records[b].size());
  }
  for (int b = 0; b < kBlocks; ++b) {
    void* reply = nullptr;
    if (redisGetReply(redis, &reply) != REDIS_OK) std::fprintf(stderr, "redis SET failed\n");
    freeReplyObject(reply);
    sample.Block();
  }
  return sample;
}

Sample RedisGet(redisContext* redis, const std::string& ns, const Prefix& p, std::vector<uint8_t>& destination) {
  Sample sample;
  const size_t slot = p.records[0].size();
  auto append = [&](int b) {
    const std::string key = ns + kvblock::HashToHex(p.hashes[b]);
    redisAppendCommand(redis, "GET %b", key.data(), key.size());
  };
  // A window of GETs in flight. Measured on this machine kind, one in flight
  // is Redis's best case: deeper pipelines make it buffer whole prefixes of
  // replies (64 in flight: 1.4 GB/s with 1 client, 0.3 GB/s with 4).
  int sent = 0;
  for (; sent < std::min(kRedisWindow, kBlocks); ++sent) append(sent);
  for (int b = 0; b < kBlocks; ++b) {
    if (sent < kBlocks) append(sent++);
    void* raw = nullptr;
    if (redisGetReply(redis, &raw) != REDIS_OK) std::fprintf(stderr, "redis GET failed\n");
    auto* reply = static_cast<redisReply*>(raw);
    if (reply != nullptr && reply->type == REDIS_REPLY_STRING && reply->len <= slot) {
      std::memcpy(destination.data() + b * slot, reply->str, reply->len);
    } else {
      std::fprintf(stderr, "redis GET: unexpected reply\n");
    }
    freeReplyObject(reply);
    sample.Block();
  }
  return sample;
}

// The physical limit of a fetch over loopback TCP: the prefix's records
// written back to back on a plain socket by a thread of this program, read
// straight into the client's buffer (no framing, no checksum, one kernel
// copy each way). Timed from the connection's acceptance.
Sample RawTcpFetch(const Prefix& p, std::vector<uint8_t>& destination) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    std::fprintf(stderr, "raw TCP: cannot listen\n");
  }
  std::thread writer([&] {
    const int s = accept(listener, nullptr, nullptr);
    for (const std::string& record : p.records) {
      for (size_t done = 0; done < record.size();) {
        const ssize_t n = write(s, record.data() + done, record.size() - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
    }
    close(s);
  });
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(s, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
    std::fprintf(stderr, "raw TCP: no connection\n");
  const size_t slot = p.records[0].size();
  Sample sample;
  for (int b = 0; b < kBlocks; ++b) {
    for (size_t done = 0; done < slot;) {
      const ssize_t n = read(s, destination.data() + b * slot + done, slot - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    sample.Block();
  }
  close(s);
  writer.join();
  close(listener);
  return sample;
}

struct Row {
  std::string what;
  int clients;
  double gbps;
  double p50_ms, p99_ms;
  double cpu_seconds_per_gb;
};

Row Summarize(const std::string& what, int clients, size_t bytes_per_client, const std::vector<Round>& rounds) {
  std::vector<double> rates, cpu, blocks;
  const double gb = static_cast<double>(bytes_per_client) * clients / 1e9;
  for (const Round& round : rounds) {
    rates.push_back(gb / round.wall);
    cpu.push_back(round.cpu / gb);
    for (const Sample& s : round.samples) {
      blocks.insert(blocks.end(), s.block_seconds.begin(), s.block_seconds.end());
    }
  }
  std::sort(blocks.begin(), blocks.end());
  // No per-block times (a row that gets its blocks all at once): NaN, shown as "-".
  auto pct = [&](double q) {
    return blocks.empty() ? NAN : 1e3 * blocks[static_cast<size_t>(q * (blocks.size() - 1))];
  };
  return Row{what, clients, load::Median(rates), pct(0.5), pct(0.99), load::Median(cpu)};
}

int Run(const std::string& cache_binary, const std::string& device_memory, const std::vector<std::string>& cache_flags,
        const std::string& redis_binary, int rounds, const std::vector<int>& client_counts, size_t fetch_streams) {
  const kvblock::LatentLayout layout = load::V2LiteInt8();
  constexpr int kMaxClients = 4;
  std::vector<Prefix> prefixes;
  for (int c = 0; c < kMaxClients; ++c) prefixes.push_back(MakePrefix(layout, "c" + std::to_string(c), c + 1));
  const size_t bytes = prefixes[0].bytes;

  constexpr uint64_t kCacheBytes = (1ull << 30) + (64ull << 20);  // its two tiers, as started here
  std::vector<std::string> cache_args = {
      cache_binary, "--listen",        "127.0.0.1:0", "--metrics-listen",    "",     "--device-capacity",
      "1GiB",       "--host-capacity", "64MiB",       "--fast-path-staging", "1GiB", "--device-memory",
      device_memory};
  cache_args.insert(cache_args.end(), cache_flags.begin(), cache_flags.end());
  ChildProcess cache(cache_args);
  const int cache_port = cache.WaitForListeningPort();
  const int redis_port = FreeLoopbackPort();  // Redis cannot report port 0
  // Redis logs to a file nobody reads, not to a pipe that could fill.
  ChildProcess redis({redis_binary, "--port", std::to_string(redis_port), "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "no", "--daemonize", "no", "--logfile", "/dev/null"});
  if (cache_port <= 0 || redis_port <= 0) {
    std::fprintf(stderr, "servers did not start\n");
    return 1;
  }
  std::vector<redisContext*> redis_clients;
  for (int c = 0; c < kMaxClients; ++c) {
    redisContext* r = nullptr;
    for (int attempt = 0; attempt < 100 && (r == nullptr || r->err); ++attempt) {
      if (r != nullptr) redisFree(r);
      r = redisConnect("127.0.0.1", redis_port);
      if (r->err) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // still starting
    }
    if (r == nullptr || r->err) {
      std::fprintf(stderr, "cannot connect to redis-server on port %d\n", redis_port);
      return 1;
    }
    redis_clients.push_back(r);
  }
  const CpuClocks cpu_clocks({cache.pid(), redis.pid()});
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<CacheClient>> clients;
  for (int c = 0; c < kMaxClients; ++c) {
    channels.push_back(MakeChannel("127.0.0.1:" + std::to_string(cache_port), Connection::kOwn));
    clients.push_back(std::make_unique<CacheClient>(channels.back(), absl::Seconds(60)));
  }
  absl::StatusOr<v1::StatsResponse> stats = clients[0]->Stats();
  if (!stats.ok()) {
    std::fprintf(stderr, "Stats: %s\n", std::string(stats.status().message()).c_str());
    return 1;
  }
  std::vector<std::unique_ptr<FastPathClient>> fast_clients;
  for (int c = 0; c < kMaxClients; ++c) {
    // On a host with the cache's GPU, as ShardSet does: the GPU tier's
    // blocks come through the session's IPC buffer (else they would be
    // left for Get).
    absl::StatusOr<std::unique_ptr<FastPathClient>> fast = FastPathClient::Connect(
        channels[c], absl::Seconds(60), /*staging_bytes=*/128 << 20, FastPathClient::DeviceStagingWanted());
    if (!fast.ok()) {
      std::fprintf(stderr, "fast path: %s\n", std::string(fast.status().message()).c_str());
      return 1;
    }
    fast_clients.push_back(*std::move(fast));
  }
  // Each client also reads as a worker does: a ShardSet of the one cache,
  // with the fast path and without.
  std::vector<std::array<std::unique_ptr<cache::ShardSet>, 2>> worker_shards(kMaxClients);
  for (auto& pair : worker_shards) {
    for (int tcp = 0; tcp < 2; ++tcp) {
      absl::StatusOr<std::unique_ptr<cache::ShardSet>> shards =
          cache::ShardSet::Create("127.0.0.1:" + std::to_string(cache_port), absl::Seconds(60), /*fast_path=*/tcp == 0,
                                  cache::ShardSet::kIdleRecordBytes, fetch_streams);
      if (!shards.ok()) {
        std::fprintf(stderr, "shard set: %s\n", std::string(shards.status().message()).c_str());
        return 1;
      }
      pair[tcp] = *std::move(shards);
    }
  }
  std::vector<runtime::SequenceCache> loaded(kMaxClients);
  std::vector<std::vector<uint8_t>> destinations(kMaxClients, std::vector<uint8_t>(bytes + 4096));

  std::vector<Row> rows;
  // A cache in service is full: its memory was written before and Put
  // reuses it. A fresh one's first fill makes the kernel fault in and
  // zero every page as it is first written, which Get never pays; so the
  // rows below run on a cache filled once, and that first fill is a row of
  // its own.
  std::vector<Round> first_fill;
  for (uint64_t filled = 0; filled < kCacheBytes; filled += bytes) {
    first_fill.push_back(Concurrently(cpu_clocks, 1, [&](int) {
      return KvtierPut(channels[0].get(), layout, absl::StrCat("fill-", filled), prefixes[0]);
    }));
  }
  rows.push_back(Summarize("kvtier Put, fresh cache's fill", 1, bytes, first_fill));
  std::vector<double> get_over_redis, again_over_redis, get_over_raw, redis_over_raw, fast_over_redis,
      fast_mapped_over_redis, fast_over_memcpy, fast_mapped_over_memcpy, get_cpu_over_redis, put_over_get,
      put_over_get_again, put_over_set, prefill_store_over_get, prefill_store_over_get_again;
  for (int n : client_counts) {
    std::vector<Round> put, staged_put, get, get_again, fast, fast_mapped, set, rget, rget_again, copy, raw,
        worker_fast, worker_tcp, prefill_tcp;
    for (int round = 0; round < rounds; ++round) {
      // Fresh namespaces each round so Put stores instead of deduplicating.
      const std::string tag = absl::StrFormat("r%d-n%d-", round, n);
      put.push_back(Concurrently(cpu_clocks, n, [&](int c) {
        return KvtierPut(channels[c].get(), layout, tag + std::to_string(c), prefixes[c]);
      }));
      // The same blocks again under other names, through the staging region.
      staged_put.push_back(Concurrently(cpu_clocks, n, [&](int c) {
        return KvtierPut(channels[c].get(), layout, "staged-" + tag + std::to_string(c), prefixes[c],
                         fast_clients[c].get());
      }));
      const auto kvtier_get = [&] {
        return Concurrently(cpu_clocks, n, [&](int c) {
          return KvtierGet(channels[c].get(), layout, tag + std::to_string(c), prefixes[c], destinations[c]);
        });
      };
      // Each fetch twice: first right after the store, then again, as a
      // prefix is read again and again once stored (the second read finds
      // neither the store's writes nor the first read in the CPU caches:
      // the prefix is twice the last-level cache).
      get.push_back(kvtier_get());
      get_again.push_back(kvtier_get());
      fast.push_back(Concurrently(cpu_clocks, n, [&](int c) {
        return KvtierFastGet(*fast_clients[c], layout, tag + std::to_string(c), prefixes[c], destinations[c]);
      }));
      set.push_back(Concurrently(
          cpu_clocks, n, [&](int c) { return RedisSet(redis_clients[c], tag + std::to_string(c), prefixes[c]); }));
      const auto redis_get = [&] {
        return Concurrently(cpu_clocks, n, [&](int c) {
          return RedisGet(redis_clients[c], tag + std::to_string(c), prefixes[c], destinations[c]);
        });
      };
      rget.push_back(redis_get());
      rget_again.push_back(redis_get());
      raw.push_back(Concurrently(cpu_clocks, n, [&](int c) { return RawTcpFetch(prefixes[c], destinations[c]); }));
      copy.push_back(Concurrently(cpu_clocks, n, [&](int c) {
        Sample s;
        const size_t slot = prefixes[c].records[0].size();
        for (int b = 0; b < kBlocks; ++b) {
          std::memcpy(destinations[c].data() + b * slot, prefixes[c].records[b].data(), slot);
          s.Block();
        }
        return s;
      }));
      worker_fast.push_back(Concurrently(cpu_clocks, n, [&](int c) {
        return WorkerLoad(*worker_shards[c][0], layout, tag + std::to_string(c), prefixes[c], loaded[c]);
      }));
      for (int c = 0; c < n; ++c) CheckLoaded(loaded[c], layout, prefixes[c]);
      worker_tcp.push_back(Concurrently(cpu_clocks, n, [&](int c) {
        return WorkerLoad(*worker_shards[c][1], layout, tag + std::to_string(c), prefixes[c], loaded[c]);
      }));
      for (int c = 0; c < n; ++c) CheckLoaded(loaded[c], layout, prefixes[c]);
      // Again, its segments now mapped (as a worker reading one tenant's
      // prefixes finds them); the copies since have flushed the CPU caches.
      fast_mapped.push_back(Concurrently(cpu_clocks, n, [&](int c) {
        return KvtierFastGet(*fast_clients[c], layout, tag + std::to_string(c), prefixes[c], destinations[c]);
      }));
      // And once more, under other names, as a prefill node stores it.
      prefill_tcp.push_back(Concurrently(cpu_clocks, n, [&](int c) {
        return PrefillStore(*worker_shards[c][1], layout, "prefill-" + tag + std::to_string(c), prefixes[c]);
      }));
      // Drop this round's keys from Redis so memory stays flat.
      for (int c = 0; c < n; ++c) freeReplyObject(redisCommand(redis_clients[c], "FLUSHALL"));
    }
    // The machine is noisy: compare kvtier and Redis round by round (they ran
    // back to back) and report the median ratio.
    // (`field` a / `field` b: wall time, or the CPU time both used to move
    // the same bytes.)
    const auto median_ratio = [&](const std::vector<Round>& a, const std::vector<Round>& b,
                                  double Round::*field = &Round::wall) {
      std::vector<double> ratios;
      for (int round = 0; round < rounds; ++round) ratios.push_back(a[round].*field / b[round].*field);
      return load::Median(ratios);
    };
    get_cpu_over_redis.push_back(median_ratio(get, rget, &Round::cpu));
    get_over_redis.push_back(median_ratio(rget, get));
    again_over_redis.push_back(median_ratio(rget_again, get_again));
    get_over_raw.push_back(median_ratio(raw, get));
    redis_over_raw.push_back(median_ratio(raw, rget));
    fast_over_redis.push_back(median_ratio(rget, fast));
    fast_mapped_over_redis.push_back(median_ratio(rget, fast_mapped));
    fast_over_memcpy.push_back(median_ratio(copy, fast));
    fast_mapped_over_memcpy.push_back(median_ratio(copy, fast_mapped));
    put_over_get.push_back(median_ratio(get, put));
    put_over_get_again.push_back(median_ratio(get_again, put));
    put_over_set.push_back(median_ratio(set, put));
    prefill_store_over_get.push_back(median_ratio(get, prefill_tcp));
    prefill_store_over_get_again.push_back(median_ratio(get_again, prefill_tcp));
    rows.push_back(Summarize("kvtier fast path, new maps", n, bytes, fast));
    rows.push_back(Summarize("kvtier fast path, mapped", n, bytes, fast_mapped));
    rows.push_back(Summarize("worker load, fast path", n, bytes, worker_fast));
    rows.push_back(Summarize("kvtier Get (fetch)", n, bytes, get));
    rows.push_back(Summarize("kvtier Get, read again", n, bytes, get_again));
    rows.push_back(Summarize("worker load, TCP", n, bytes, worker_tcp));
    rows.push_back(Summarize("redis GET, pipelined (fetch)", n, bytes, rget));
    rows.push_back(Summarize("redis GET, read again", n, bytes, rget_again));
    rows.push_back(Summarize("raw TCP socket (fetch)", n, bytes, raw));
    rows.push_back(Summarize("kvtier Put (store)", n, bytes, put));
    rows.push_back(Summarize("kvtier Put, fast path (store)", n, bytes, staged_put));
    rows.push_back(Summarize("prefill store, TCP", n, bytes, prefill_tcp));
    rows.push_back(Summarize("redis SET, pipelined (store)", n, bytes, set));
    rows.push_back(Summarize("memcpy", n, bytes, copy));
  }
  std::printf(
      "4,096-token prefix, DeepSeek-V2-Lite int8: %d blocks x %u layers, %zu B a block, "
      "%.1f MB a client; loopback TCP, congestion control %s; Redis GETs in flight: %d; "
      "median of %d rounds\n\n",
      kBlocks, layout.num_layers, prefixes[0].records[0].size(), bytes / 1e6, TcpCongestionControl().c_str(),
      kRedisWindow, rounds);
  // CPU s/GB: CPU time of this program, the cache and Redis together per GB
  // moved, whichever of them did the work.
  std::printf("%-30s %8s %10s %14s %14s %10s\n", "path", "clients", "GB/s", "p50 ms/block", "p99 ms/block", "CPU s/GB");
  for (const Row& r : rows) {
    const auto ms = [](double v) { return std::isnan(v) ? std::string("-") : absl::StrFormat("%.3f", v); };
    std::printf("%-30s %8d %10.2f %14s %14s %10.3f\n", r.what.c_str(), r.clients, r.gbps, ms(r.p50_ms).c_str(),
                ms(r.p99_ms).c_str(), r.cpu_seconds_per_gb);
  }
  const auto print_ratios = [&](const char* what, const std::vector<double>& ratios, const char* target) {
    std::printf("%s, median of per-round ratios:", what);
    for (size_t i = 0; i < client_counts.size(); ++i) {
      std::printf("%s %d client%s %.2fx", i ? "," : "", client_counts[i], client_counts[i] == 1 ? "" : "s", ratios[i]);
    }
    std::printf(" (%s)\n", target);
  };
  std::printf("\n");
  print_ratios("kvtier Get (TCP) / redis GET", get_over_redis, "target >= 1");
  print_ratios("kvtier Get (TCP) / redis GET, read again", again_over_redis, "target >= 1");
  print_ratios("kvtier Get (TCP) / raw TCP socket", get_over_raw, "1 would be the physical limit");
  print_ratios("redis GET / raw TCP socket", redis_over_raw, "1 would be the physical limit");
  print_ratios("kvtier Get (TCP) / redis GET, CPU time", get_cpu_over_redis, "below 1: less CPU a byte");
  print_ratios("kvtier fast path, new maps / redis GET", fast_over_redis, "target >= 2");
  print_ratios("kvtier fast path, mapped / redis GET", fast_mapped_over_redis, "target >= 2");
  print_ratios("kvtier fast path, new maps / memcpy", fast_over_memcpy, "target >= 0.4");
  print_ratios("kvtier fast path, mapped / memcpy", fast_mapped_over_memcpy, "target >= 0.4");
  print_ratios("kvtier Put / kvtier Get (TCP)", put_over_get, "target >= 0.8");
  print_ratios("kvtier Put / kvtier Get, read again", put_over_get_again, "target >= 0.8");
  print_ratios("kvtier Put / redis SET", put_over_set, "target >= 1");
  print_ratios("prefill store / kvtier Get (TCP)", prefill_store_over_get, "target >= 0.8");
  print_ratios("prefill store / kvtier Get, read again", prefill_store_over_get_again, "target >= 0.8");
  for (redisContext* r : redis_clients) redisFree(r);
  return 0;
}

}  // namespace
}  // namespace kvtier::cache

int main(int argc, char** argv) {
  std::string cache_binary = "build/services/kvtier-cache";
  std::string device_memory = "auto";
  std::string redis_binary = "/usr/bin/redis-server";
  uint64_t rounds = 5;
  uint64_t window = 1;
  std::string clients = "1,4";
  std::string cache_flags;
  uint64_t fetch_streams = 0;
  kvtier::FlagParser flags("cache_bench [--cache-binary PATH] [--rounds N]",
                           "kvtier-cache Get/Put vs Redis pipelined GET/SET vs memcpy, one run.");
  flags.AddString("cache-binary", &cache_binary, "kvtier-cache to start");
  flags.AddString("device-memory", &device_memory,
                  "kvtier-cache's --device-memory: where its device tier lives (auto: a GPU when there is one)");
  flags.AddString(
      "cache-flags", &cache_flags,
      "more flags for kvtier-cache, space-separated (--no-demote-ahead: Put as before room was kept ahead)");
  flags.AddString("redis-binary", &redis_binary, "redis-server to start");
  flags.AddUint("rounds", &rounds, "measurements per row (the median is shown)");
  flags.AddUint("redis-window", &window, "pipelined Redis GETs in flight per client");
  flags.AddString("clients", &clients, "concurrent client counts to run, each 1..4");
  flags.AddUint("fetch-streams", &fetch_streams,
                "streams at once a worker load reads its prefix over TCP in, 1..4 (0: a decode worker's "
                "default, one for every four usable cores)");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "cache_bench")) {
    return *exit;
  }
  if (absl::Status s = kvtier::cache::ShardSet::CheckFetchStreams(fetch_streams); !s.ok()) {
    std::fprintf(stderr, "--fetch-streams %s\n", std::string(s.message()).c_str());
    return 2;
  }
  kvtier::cache::kRedisWindow = static_cast<int>(std::clamp<uint64_t>(window, 1, 64));
  std::vector<int> counts;
  for (absl::string_view c : absl::StrSplit(clients, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(c, &n) || n < 1 || n > 4) {
      std::fprintf(stderr, "--clients: '%s' is not a count in 1..4\n", std::string(c).c_str());
      return 2;
    }
    counts.push_back(n);
  }
  const std::vector<std::string> extra = absl::StrSplit(cache_flags, ' ', absl::SkipEmpty());
  return kvtier::cache::Run(cache_binary, device_memory, extra, redis_binary,
                            static_cast<int>(std::max<uint64_t>(rounds, 1)), counts, fetch_streams);
}
