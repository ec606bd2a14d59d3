// What TLS costs a fetch, side by side in one run: kvtier Get (RawGet into
// the client's buffer) in plaintext and over TLS, against Redis 7 GET over
// TLS (Debian's redis-server, --tls-port). Each client stores a prefix of
// DeepSeek-V2-Lite int8 blocks in both caches and in Redis, then fetches
// it from each in turn, round after round (the machine is noisy: ratios
// are taken round by round). Redis is read as cache_bench reads it, one
// GET in flight, each reply copied into the same kind of buffer; its TLS
// is OpenSSL's, its replies parsed by hiredis's reader. Certificates: a
// throwaway CA made with the openssl command line. "Worker load, TLS": the
// same prefix over TLS as a decode worker reads it (ShardSet::Fetch, in
// one stream for every four usable cores unless --fetch-streams says).
//
//   tls_bench --cache-binary build/services/kvtier-cache [--rounds 3] [--blocks 32]
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "load/bench_layout.h"
#include "load/median.h"
#include "services/base/child_process.h"
#include "services/base/flags.h"
#include "services/cache/client/cache_client.h"
#include "services/cache/client/raw_get.h"
#include "services/cache/client/shard_set.h"
#include "services/cli/certificates.h"
#include "services/rpc/client_identity.h"

namespace kvtier::load {
namespace {

using cache::CacheClient;

struct Prefix {
  std::vector<cache::BlockSlices> slices;
  std::vector<kvblock::BlockHash> hashes;
  size_t record_bytes = 0;
};

Prefix MakePrefix(const kvblock::LatentLayout& layout, const std::string& ns, int blocks) {
  Prefix p;
  const std::vector<std::vector<std::string>> slices = RandomBlockSlices(layout, blocks);
  std::vector<uint32_t> tokens(size_t{layout.tokens_per_block} * blocks);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7919 + ns.size());
  p.hashes = kvblock::ComputeBlockChain(ns, kvblock::LayoutId(layout), layout.tokens_per_block, tokens);
  for (int b = 0; b < blocks; ++b) p.slices.push_back({p.hashes[b], slices[b]});
  p.record_bytes = kvblock::HeaderFor(layout, 0, layout.num_layers).RecordBytes();
  return p;
}

// Seconds `work(c)` takes on n threads at once.
template <typename Work>
double Concurrently(int n, Work work) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < n; ++c) threads.emplace_back([&, c] { work(c); });
  for (std::thread& t : threads) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One client's fetch of its prefix with RawGet; false unless every block landed.
bool KvtierGet(grpc::Channel* channel, const kvblock::LatentLayout& layout, const std::string& ns, const Prefix& p,
               std::vector<uint8_t>& destination) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  size_t landed = 0;
  const grpc::Status status = cache::RawGet(
      channel, &context, cache::MakeGetRequest(ns, layout, p.hashes),
      [&](uint32_t index, size_t) {
        return std::span<uint8_t>(destination.data() + index * p.record_bytes, p.record_bytes);
      },
      [&](const cache::RawBlock& block) { landed += block.status.ok() ? 1 : 0; });
  return status.ok() && landed == p.hashes.size();
}

// A Redis connection over OpenSSL's TLS, replies parsed by hiredis's reader.
class RedisTls {
 public:
  static std::unique_ptr<RedisTls> Connect(int port, const std::string& ca_file) {
    auto r = std::unique_ptr<RedisTls>(new RedisTls);
    r->ctx_ = SSL_CTX_new(TLS_client_method());
    if (SSL_CTX_load_verify_locations(r->ctx_, ca_file.c_str(), nullptr) != 1) return nullptr;
    SSL_CTX_set_verify(r->ctx_, SSL_VERIFY_PEER, nullptr);
    for (int attempt = 0; attempt < 100; ++attempt) {  // Redis may still be starting
      r->fd_ = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
      if (connect(r->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
      close(r->fd_);
      r->fd_ = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (r->fd_ < 0) return nullptr;
    r->ssl_ = SSL_new(r->ctx_);
    SSL_set_fd(r->ssl_, r->fd_);
    SSL_set1_host(r->ssl_, "127.0.0.1");
    if (SSL_connect(r->ssl_) != 1) return nullptr;
    r->reader_ = redisReaderCreate();
    return r;
  }
  ~RedisTls() {
    if (reader_ != nullptr) redisReaderFree(reader_);
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) close(fd_);
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
  }

  // Sends one command (RESP array of bulk strings).
  bool Send(const std::vector<absl::string_view>& args) {
    std::string out = absl::StrCat("*", args.size(), "\r\n");
    for (absl::string_view a : args) absl::StrAppend(&out, "$", a.size(), "\r\n", a, "\r\n");
    return SSL_write(ssl_, out.data(), static_cast<int>(out.size())) == static_cast<int>(out.size());
  }
  // The next reply (a redisReply, hiredis's reader building it with its
  // default functions); null on error. The caller frees it.
  redisReply* Reply() {
    void* reply = nullptr;
    while (true) {
      if (redisReaderGetReply(reader_, &reply) != REDIS_OK) return nullptr;
      if (reply != nullptr) return static_cast<redisReply*>(reply);
      char buffer[1 << 16];
      const int n = SSL_read(ssl_, buffer, sizeof buffer);
      if (n <= 0) return nullptr;
      redisReaderFeed(reader_, buffer, n);
    }
  }

 private:
  RedisTls() = default;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  redisReader* reader_ = nullptr;
};

std::string RedisKey(const std::string& ns, const kvblock::BlockHash& h) {
  return absl::StrCat(ns, "/", kvblock::HashToHex(h));
}

bool RedisSet(RedisTls& redis, const std::string& ns, const Prefix& p, const std::vector<std::string>& records) {
  for (size_t b = 0; b < p.hashes.size(); ++b) {
    if (!redis.Send({"SET", RedisKey(ns, p.hashes[b]), records[b]})) return false;
  }
  for (size_t b = 0; b < p.hashes.size(); ++b) {
    redisReply* reply = redis.Reply();
    if (reply == nullptr) return false;
    freeReplyObject(reply);
  }
  return true;
}

bool RedisGet(RedisTls& redis, const std::string& ns, const Prefix& p, std::vector<uint8_t>& destination) {
  for (size_t b = 0; b < p.hashes.size(); ++b) {
    if (!redis.Send({"GET", RedisKey(ns, p.hashes[b])})) return false;
    redisReply* reply = redis.Reply();
    if (reply == nullptr) return false;
    const bool ok = reply->type == REDIS_REPLY_STRING && reply->len == p.record_bytes;
    if (ok) std::memcpy(destination.data() + b * p.record_bytes, reply->str, reply->len);
    freeReplyObject(reply);
    if (!ok) return false;
  }
  return true;
}

int Run(const std::string& cache_binary, const std::string& redis_binary, int rounds, int blocks,
        size_t fetch_streams) {
  const kvblock::LatentLayout layout = V2LiteInt8();
  constexpr int kMaxClients = 4;
  const std::string root = absl::StrCat("/tmp/kvtier-tls-bench-", getpid()), dir = root + "/server";
  if (absl::Status s = cli::MakeCertificates(
          {.dir = root, .server_names = {"localhost", "127.0.0.1"}, .clients = {}, .days = 1, .keep_ca_key = false});
      !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  const std::vector<std::string> cache_flags = {"--listen",          "127.0.0.1:0", "--metrics-listen", "",
                                                "--device-capacity", "1GiB",        "--host-capacity",  "64MiB",
                                                "--no-fast-path"};
  std::vector<std::string> plain_argv = {cache_binary}, tls_argv = {cache_binary};
  plain_argv.insert(plain_argv.end(), cache_flags.begin(), cache_flags.end());
  tls_argv.insert(tls_argv.end(), cache_flags.begin(), cache_flags.end());
  tls_argv.insert(tls_argv.end(), {"--tls-dir", dir});
  ChildProcess plain_cache(plain_argv), tls_cache(tls_argv);
  const int plain_port = plain_cache.WaitForListeningPort(), tls_port = tls_cache.WaitForListeningPort();
  const int redis_port = FreeLoopbackPort();
  ChildProcess redis({redis_binary,
                      "--port",
                      "0",
                      "--tls-port",
                      std::to_string(redis_port),
                      "--bind",
                      "127.0.0.1",
                      "--tls-cert-file",
                      dir + "/tls.crt",
                      "--tls-key-file",
                      dir + "/tls.key",
                      "--tls-ca-cert-file",
                      dir + "/ca.crt",
                      "--tls-auth-clients",
                      "no",
                      "--save",
                      "",
                      "--appendonly",
                      "no",
                      "--logfile",
                      "/dev/null"});
  if (plain_port <= 0 || tls_port <= 0) {
    std::fprintf(stderr, "caches did not start\n");
    return 1;
  }
  std::vector<Prefix> prefixes;
  std::vector<std::vector<std::string>> records(kMaxClients);
  std::vector<std::shared_ptr<grpc::Channel>> plain, tls;
  std::vector<std::unique_ptr<RedisTls>> redis_clients;
  for (int c = 0; c < kMaxClients; ++c) {
    prefixes.push_back(MakePrefix(layout, absl::StrCat("c", c), blocks));
    for (const cache::BlockSlices& b : prefixes.back().slices) {
      std::string whole;
      for (const std::string& s : b.records) whole += s;  // Redis's value: the bytes, whatever their shape
      records[c].push_back(whole.substr(0, prefixes.back().record_bytes));
    }
    plain.push_back(*MakeChannelAs({}, absl::StrCat("127.0.0.1:", plain_port), Connection::kOwn));
    tls.push_back(*MakeChannelAs({.tls = {.dir = dir}, .token_file = ""}, absl::StrCat("127.0.0.1:", tls_port),
                                 Connection::kOwn));
    redis_clients.push_back(RedisTls::Connect(redis_port, dir + "/ca.crt"));
    if (redis_clients.back() == nullptr) {
      std::fprintf(stderr, "cannot reach redis-server over TLS on port %d\n", redis_port);
      return 1;
    }
    for (auto* channel : {&plain.back(), &tls.back()}) {
      if (!CacheClient(*channel, absl::Seconds(60)).Put(absl::StrCat("c", c), layout, prefixes.back().slices).ok()) {
        std::fprintf(stderr, "Put failed\n");
        return 1;
      }
    }
    if (!RedisSet(*redis_clients.back(), absl::StrCat("c", c), prefixes.back(), records[c])) {
      std::fprintf(stderr, "Redis SET failed\n");
      return 1;
    }
  }
  // The workers' shard sets take the process's identity: TLS from here on.
  if (absl::Status s = SetClientIdentity({.tls = {.dir = dir}, .token_file = ""}); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  // Each reads its prefix once first, as a worker in service has its
  // connections made and its record pool filled.
  std::vector<std::unique_ptr<cache::ShardSet>> workers;
  for (int c = 0; c < kMaxClients; ++c) {
    absl::StatusOr<std::unique_ptr<cache::ShardSet>> worker =
        cache::ShardSet::Create(absl::StrCat("127.0.0.1:", tls_port), absl::Seconds(60), /*fast_path=*/false,
                                cache::ShardSet::kIdleRecordBytes, fetch_streams);
    if (!worker.ok()) {
      std::fprintf(stderr, "shard set: %s\n", std::string(worker.status().message()).c_str());
      return 1;
    }
    workers.push_back(*std::move(worker));
    workers.back()->Fetch(absl::StrCat("c", c), layout, prefixes[c].hashes);
  }
  const size_t bytes = prefixes[0].record_bytes * blocks;
  std::vector<std::vector<uint8_t>> destinations(kMaxClients, std::vector<uint8_t>(bytes));
  std::printf(
      "%d DeepSeek-V2-Lite int8 blocks (%zu B each, %.1f MB) a client, loopback, one fetch at a time a client; "
      "%d rounds, interleaved\n\n",
      blocks, prefixes[0].record_bytes, bytes / 1e6, rounds);
  std::printf("%-28s %8s %18s\n", "path", "clients", "GB/s (per round)");
  std::vector<std::string> summary;
  for (int n : {1, kMaxClients}) {
    std::vector<double> plain_s, tls_s, worker_s, redis_s;
    bool ok = true;
    for (int round = 0; round < rounds; ++round) {
      const auto fetch = [&](std::vector<std::shared_ptr<grpc::Channel>>& channels) {
        return Concurrently(n, [&](int c) {
          if (!KvtierGet(channels[c].get(), layout, absl::StrCat("c", c), prefixes[c], destinations[c])) ok = false;
        });
      };
      plain_s.push_back(fetch(plain));
      tls_s.push_back(fetch(tls));
      worker_s.push_back(Concurrently(n, [&](int c) {
        for (const absl::StatusOr<cache::SharedRecord>& r :
             workers[c]->Fetch(absl::StrCat("c", c), layout, prefixes[c].hashes)) {
          if (!r.ok()) ok = false;
        }
      }));
      redis_s.push_back(Concurrently(n, [&](int c) {
        if (!RedisGet(*redis_clients[c], absl::StrCat("c", c), prefixes[c], destinations[c])) ok = false;
      }));
    }
    if (!ok) std::fprintf(stderr, "a fetch did not land every block\n");
    const double gb = bytes * n / 1e9;
    for (auto [what, seconds] : {std::pair{"kvtier Get, plaintext", &plain_s},
                                 {"kvtier Get, TLS", &tls_s},
                                 {"worker load, TLS", &worker_s},
                                 {"redis GET, TLS", &redis_s}}) {
      std::string per_round;
      for (double s : *seconds) absl::StrAppend(&per_round, absl::StrFormat(" %.2f", gb / s));
      std::printf("%-28s %8d %8.2f  (%s )\n", what, n, gb / Median(*seconds), per_round.c_str());
    }
    std::vector<double> tls_over_plain, tls_over_redis, worker_over_get;
    for (int r = 0; r < rounds; ++r) {
      tls_over_plain.push_back(plain_s[r] / tls_s[r]);
      tls_over_redis.push_back(redis_s[r] / tls_s[r]);
      worker_over_get.push_back(tls_s[r] / worker_s[r]);
    }
    summary.push_back(absl::StrFormat(
        "%d client%s: kvtier TLS / plaintext %.2fx (target >= 0.70), kvtier TLS / redis TLS %.2fx (target >= 1), "
        "worker load TLS / kvtier Get TLS %.2fx",
        n, n == 1 ? "" : "s", Median(tls_over_plain), Median(tls_over_redis), Median(worker_over_get)));
  }
  std::printf("\nmedian of per-round ratios:\n");
  for (const std::string& line : summary) std::printf("  %s\n", line.c_str());
  std::filesystem::remove_all(root);
  return 0;
}

}  // namespace
}  // namespace kvtier::load

int main(int argc, char** argv) {
  std::string cache_binary = "build/services/kvtier-cache", redis_binary = "/usr/bin/redis-server";
  uint64_t rounds = 3, blocks = 32, fetch_streams = 0;
  kvtier::FlagParser flags("tls_bench [flags]", "kvtier Get in plaintext and over TLS against Redis GET over TLS.");
  flags.AddString("cache-binary", &cache_binary, "the kvtier-cache to run");
  flags.AddString("redis-binary", &redis_binary, "redis-server (7, built with TLS)");
  flags.AddUint("rounds", &rounds, "rounds, each fetching from all three");
  flags.AddUint("blocks", &blocks, "blocks a client");
  flags.AddUint("fetch-streams", &fetch_streams,
                "streams at once a worker load reads its prefix in, 1..4 (0: a decode worker's default, one for "
                "every four usable cores)");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "tls_bench")) {
    return *exit;
  }
  if (absl::Status s = kvtier::cache::ShardSet::CheckFetchStreams(fetch_streams); !s.ok()) {
    std::fprintf(stderr, "--fetch-streams %s\n", std::string(s.message()).c_str());
    return 2;
  }
  return kvtier::load::Run(cache_binary, redis_binary, static_cast<int>(rounds), static_cast<int>(blocks),
                           fetch_streams);
}
