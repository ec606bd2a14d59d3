// Finding cache shards and decode workers through DNS SRV records, as on
// Kubernetes (a headless Service publishes one per ready pod), against a
// real DNS server (dnsmasq) whose answers change during the test; and the
// shards' health as decode and prefill report it. Names end in '.', so the
// test host's search domains play no part.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "services/base/metrics_page.h"
#include "services/base/peer_discovery.h"
#include "services/rpc/client_identity.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model_config.h"
#include "tests/eventually.h"
#include "tests/integration/cluster.h"
#include "tests/integration/dns_server.h"
#include "tests/test_random.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;
using testing::DnsServer;
using testing::Eventually;

TEST(DnsSrv, AnswersWhatTheServerHoldsAndNothingForAnUnknownName) {
  DnsServer dns;
  ASSERT_TRUE(
      dns.Serve({{"_grpc._tcp.cache.kvtier.test.", {{"cache-0.kvtier.test", 7070}, {"cache-1.kvtier.test", 7071}}}}));
  absl::StatusOr<std::vector<SrvRecord>> got = LookUpSrv("_grpc._tcp.cache.kvtier.test.", dns.address());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  std::sort(got->begin(), got->end(), [](const SrvRecord& a, const SrvRecord& b) { return a.port < b.port; });
  EXPECT_EQ((*got)[0].host, "cache-0.kvtier.test");
  EXPECT_EQ((*got)[0].port, 7070);
  EXPECT_EQ((*got)[1].host, "cache-1.kvtier.test");
  EXPECT_EQ((*got)[1].port, 7071);
  EXPECT_EQ((*got)[1].weight, 100);

  absl::StatusOr<std::vector<SrvRecord>> none = LookUpSrv("_grpc._tcp.other.kvtier.test.", dns.address());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty()) << "NXDOMAIN is an answer: no records";

  const std::string nobody = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  EXPECT_EQ(LookUpSrv("_grpc._tcp.cache.kvtier.test.", nobody).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(LookUpSrv("x.kvtier.test", "localhost:53").status().code(), absl::StatusCode::kInvalidArgument);
}

// What a PeerDiscovery has told its owner, as it tells it (from its
// thread).
class Seen {
 public:
  PeerDiscovery::OnChange Record() {
    return [this](const std::vector<std::string>& targets) {
      std::lock_guard<std::mutex> lock(mu_);
      calls_.push_back(targets);
    };
  }
  std::vector<std::vector<std::string>> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::vector<std::string> last() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_.empty() ? std::vector<std::string>{} : calls_.back();
  }

 private:
  std::mutex mu_;
  std::vector<std::vector<std::string>> calls_;
};

// A name that answers NXDOMAIN now and then (for fewer look-ups in a row
// than it takes to be believed) keeps its targets; one gone for good
// loses them.
TEST(PeerDiscoveryTest, AFlappingNameKeepsItsTargets) {
  const std::string name = "_grpc._tcp.flapping.kvtier.test.";
  const std::map<std::string, std::vector<SrvRecord>> there = {
      {name, {{"peer-0.kvtier.test", 7070}, {"peer-1.kvtier.test", 7071}}}};
  // Another name only: the server is up, and `name` is NXDOMAIN.
  const std::map<std::string, std::vector<SrvRecord>> gone = {
      {"_grpc._tcp.other.kvtier.test.", {{"other.kvtier.test", 7070}}}};
  DnsServer dns;
  ASSERT_TRUE(dns.Serve(there));
  Seen seen;
  PeerDiscovery::Options options;
  options.interval = absl::Milliseconds(300);
  options.dns_server = dns.address();
  absl::StatusOr<std::unique_ptr<PeerDiscovery>> discovery =
      PeerDiscovery::Start("peers", "srv:" + name, options, seen.Record());
  ASSERT_TRUE(discovery.ok()) << discovery.status();
  for (int flap = 0; flap < 4; ++flap) {
    ASSERT_TRUE(dns.Serve(gone));
    std::this_thread::sleep_for(std::chrono::milliseconds(350));  // one or two look-ups
    ASSERT_TRUE(dns.Serve(there));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  const std::vector<std::vector<std::string>> calls = seen.calls();
  ASSERT_EQ(calls.size(), 1u) << "the targets changed while the name flapped";
  EXPECT_EQ(calls[0], (std::vector<std::string>{"peer-0.kvtier.test:7070", "peer-1.kvtier.test:7071"}));
  ASSERT_TRUE(dns.Serve(gone));
  EXPECT_TRUE(Eventually([&] { return seen.calls().size() == 2 && seen.last().empty(); }))
      << "a name gone for good kept its targets";
}

// Records that name no HOST:PORT are skipped; a flood of records is
// bounded, and cannot push out the targets in use.
TEST(PeerDiscoveryTest, SkipsBadRecordsAndBoundsTheTargetsKnownFirst) {
  const std::string name = "_grpc._tcp.flooded.kvtier.test.";
  const SrvRecord in_use = {"peer-z.kvtier.test", 7070};  // sorts after the flood
  DnsServer dns;
  ASSERT_TRUE(dns.Serve({{name, {in_use}}}));
  Seen seen;
  PeerDiscovery::Options options;
  options.interval = absl::Milliseconds(200);
  options.dns_server = dns.address();
  options.max_targets = 8;
  absl::StatusOr<std::unique_ptr<PeerDiscovery>> discovery =
      PeerDiscovery::Start("peers", "srv:" + name, options, seen.Record());
  ASSERT_TRUE(discovery.ok()) << discovery.status();
  ASSERT_EQ(seen.last(), std::vector<std::string>{"peer-z.kvtier.test:7070"});
  std::vector<SrvRecord> flood = {in_use, {"peer-bad.kvtier.test", 0}};
  for (int i = 0; i < 40; ++i) flood.push_back({absl::StrCat("peer-", 100 + i, ".kvtier.test"), 7070});
  ASSERT_TRUE(dns.Serve({{name, flood}}));
  ASSERT_TRUE(Eventually([&] { return seen.calls().size() >= 2; }));
  const std::vector<std::string> chosen = seen.last();
  EXPECT_EQ(chosen.size(), 8u);
  EXPECT_TRUE(std::find(chosen.begin(), chosen.end(), "peer-z.kvtier.test:7070") != chosen.end())
      << "the target in use was pushed out";
  for (const std::string& t : chosen) EXPECT_FALSE(t.ends_with(":0")) << t;
}

class DiscoveryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ =
        new std::string((fs::temp_directory_path() / ("kvtier_discovery_" + std::to_string(getpid()))).string());
    ASSERT_TRUE(runtime::MakeModel(*runtime::PresetConfig("tiny"), *model_dir_, 3).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(*model_dir_); }

  static std::unique_ptr<ChildProcess> StartCache(std::string& target) {
    std::string metrics;
    return Cluster::Start({KVTIER_CACHE_BINARY, "--listen", "127.0.0.1:0", "--device-capacity", "16MiB",
                           "--host-capacity", "16MiB", "--metrics-listen", "127.0.0.1:0"},
                          metrics, target);
  }
  // The SRV record of a server listening on 127.0.0.1:port: its target is
  // `localhost`, a name every test host resolves.
  static SrvRecord RecordOf(const std::string& target) {
    return {"localhost", static_cast<uint16_t>(std::stoi(target.substr(target.rfind(':') + 1)))};
  }
  static std::string Shard(const std::string& target) { return "localhost:" + target.substr(target.rfind(':') + 1); }

  static std::string* model_dir_;
};
std::string* DiscoveryTest::model_dir_ = nullptr;

double Scrape(const std::string& address, const std::string& series) {
  return MetricValue(ScrapeMetrics(address), series).value_or(-1.0);
}

// `kubectl scale` as DNS sees it: a shard's record appears, and decode and
// prefill start using it within an interval; one that dies is reported
// down (and recomputed around); one whose record goes is dropped.
TEST_F(DiscoveryTest, ShardsComeAndGoWithTheirDnsRecords) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const std::string cache_name = "_grpc._tcp.kvtier-cache.kvtier.test.";
  const std::string decode_name = "_grpc._tcp.kvtier-decode.kvtier.test.";
  std::string a, b, decode_target, decode_metrics, prefill_target, prefill_metrics;
  std::unique_ptr<ChildProcess> cache_a = StartCache(a), cache_b = StartCache(b);
  ASSERT_FALSE(a.empty() || b.empty());
  DnsServer dns;
  ASSERT_TRUE(dns.Serve({{cache_name, {RecordOf(a)}}}));  // no decode worker yet
  const std::vector<std::string> watch = {
      "--dns-server", dns.address(), "--watch-interval-ms", "200",     "--metrics-listen", "127.0.0.1:0", "--listen",
      "127.0.0.1:0",  "--model",     *model_dir_,           "--cache", "srv:" + cache_name};
  std::vector<std::string> argv = {KVTIER_DECODE_BINARY};
  argv.insert(argv.end(), watch.begin(), watch.end());
  std::unique_ptr<ChildProcess> decode = Cluster::Start(argv, decode_metrics, decode_target);
  argv = {KVTIER_PREFILL_BINARY,        "--decode", "srv:" + decode_name, "--kv-codec", "bf16", "--tokens-per-block",
          std::to_string(kClusterBlock)};
  argv.insert(argv.end(), watch.begin(), watch.end());
  std::unique_ptr<ChildProcess> prefill = Cluster::Start(argv, prefill_metrics, prefill_target);
  ASSERT_FALSE(decode_target.empty() || prefill_target.empty());

  std::uniform_int_distribution<uint32_t> id(0, 255);
  v1::GenerateRequest request;
  // 16 whole blocks and a few tokens (the last token is always computed).
  constexpr uint32_t kCached = 16 * kClusterBlock;
  for (uint32_t i = 0; i < kCached + 5; ++i) request.add_prompt_token_ids(id(rng.engine()));
  request.mutable_limits()->set_max_new_tokens(4);
  auto generate = [&] { return cli::GenerateRemotely(prefill_target, request, absl::Minutes(2)); };

  // No decode worker is published yet: a clear UNAVAILABLE.
  absl::StatusOr<cli::RemoteGeneration> got = generate();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  ASSERT_TRUE(dns.Serve({{cache_name, {RecordOf(a)}}, {decode_name, {RecordOf(decode_target)}}}));
  ASSERT_TRUE(Eventually([&] { return generate().ok(); })) << "the decode worker's record was not picked up";
  got = generate();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->usage.cached_tokens(), kCached) << "all of it on the one shard";
  for (const std::string& metrics : {decode_metrics, prefill_metrics}) {
    const std::string prefix = metrics == decode_metrics ? "kvtier_decode" : "kvtier_prefill";
    EXPECT_TRUE(Eventually([&] {
      return Scrape(metrics, prefix + "_cache_shard_up{shard=\"" + Shard(a) + "\"}") == 1;
    })) << prefix;
  }

  // Scale to two shards: B takes its share of the keys (misses, computed
  // again and stored on B), and the next request hits all of it again.
  ASSERT_TRUE(dns.Serve({{cache_name, {RecordOf(a), RecordOf(b)}}, {decode_name, {RecordOf(decode_target)}}}));
  for (const std::string& metrics : {decode_metrics, prefill_metrics}) {
    const std::string prefix = metrics == decode_metrics ? "kvtier_decode" : "kvtier_prefill";
    EXPECT_TRUE(Eventually([&] {
      return Scrape(metrics, prefix + "_cache_shard_up{shard=\"" + Shard(b) + "\"}") == 1 &&
             Scrape(metrics, prefix + "_cache_shards{state=\"up\"}") == 2;
    })) << prefix;
  }
  got = generate();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_LT(got->usage.cached_tokens(), kCached) << "no block moved to the new shard (a 2^-16 chance)";
  absl::StatusOr<v1::StatsResponse> b_stats = cache::CacheClient(MakeChannel(b), absl::Seconds(5)).Stats();
  ASSERT_TRUE(b_stats.ok()) << b_stats.status();
  EXPECT_GT(b_stats->blocks_stored(), 0u);
  got = generate();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->usage.cached_tokens(), kCached);

  // B dies: reported down within an interval; requests go on, B's blocks
  // recomputed.
  cache_b->Stop(SIGKILL);
  EXPECT_TRUE(Eventually([&] {
    return Scrape(prefill_metrics, "kvtier_prefill_cache_shard_up{shard=\"" + Shard(b) + "\"}") == 0 &&
           Scrape(prefill_metrics, "kvtier_prefill_cache_shards{state=\"down\"}") == 1;
  }));
  got = generate();
  ASSERT_TRUE(got.ok()) << got.status();
  // Its record goes (the StatefulSet scaled down): the shard is forgotten.
  ASSERT_TRUE(dns.Serve({{cache_name, {RecordOf(a)}}, {decode_name, {RecordOf(decode_target)}}}));
  EXPECT_TRUE(Eventually([&] {
    return Scrape(decode_metrics, "kvtier_decode_cache_shard_up{shard=\"" + Shard(b) + "\"}") == -1 &&
           Scrape(decode_metrics, "kvtier_decode_cache_shards{state=\"down\"}") == 0 &&
           Scrape(decode_metrics, "kvtier_decode_cache_shards{state=\"up\"}") == 1;
  }));
  // No shard at all: still served, everything computed.
  ASSERT_TRUE(dns.Serve({{decode_name, {RecordOf(decode_target)}}}));
  EXPECT_TRUE(Eventually([&] { return Scrape(prefill_metrics, "kvtier_prefill_cache_shards{state=\"up\"}") == 0; }));
  got = generate();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->usage.cached_tokens(), 0u);
}

// A shard that restarts (a cache pod replaced) after a long absence is
// used again within the watch interval, not once gRPC's reconnect backoff
// (grown to seconds by then) runs out.
TEST_F(DiscoveryTest, ARestartedShardIsUsedAgainWithinAnInterval) {
  std::string target, prefill_target, prefill_metrics;
  std::unique_ptr<ChildProcess> cache = StartCache(target);
  ASSERT_FALSE(target.empty());
  std::string decode_target, decode_metrics;
  std::unique_ptr<ChildProcess> decode =
      Cluster::Start({KVTIER_DECODE_BINARY, "--watch-interval-ms", "200", "--metrics-listen", "127.0.0.1:0", "--listen",
                      "127.0.0.1:0", "--model", *model_dir_, "--cache", target},
                     decode_metrics, decode_target);
  ASSERT_FALSE(decode_target.empty());
  const std::string up = "kvtier_decode_cache_shard_up{shard=\"" + target + "\"}";
  ASSERT_TRUE(Eventually([&] { return Scrape(decode_metrics, up) == 1; }));
  cache->Stop(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return Scrape(decode_metrics, up) == 0; }));
  // Away long enough for the backoff to reach several seconds.
  std::this_thread::sleep_for(std::chrono::seconds(12));
  cache = std::make_unique<ChildProcess>(std::vector<std::string>{KVTIER_CACHE_BINARY, "--listen", target,
                                                                  "--device-capacity", "16MiB", "--host-capacity",
                                                                  "16MiB", "--metrics-listen", ""});
  ASSERT_EQ(absl::StrCat("127.0.0.1:", cache->WaitForListeningPort()), target) << "not back on its port";
  const auto back = std::chrono::steady_clock::now();
  ASSERT_TRUE(Eventually([&] { return Scrape(decode_metrics, up) == 1; }, std::chrono::seconds(30)));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - back).count();
  std::cout << "the restarted shard was up again after " << seconds << " s" << std::endl;
  EXPECT_LT(seconds, 2.0) << "a 200 ms watch interval, with margin for a loaded machine";
}

// A target that is not a decode worker (here a cache, which answers
// UNIMPLEMENTED) is failed over from, as a worker that is down would be.
TEST_F(DiscoveryTest, ATargetThatIsNoDecodeWorkerIsFailedOver) {
  std::string cache_target, decode_target, decode_metrics, prefill_target, prefill_metrics;
  std::unique_ptr<ChildProcess> cache = StartCache(cache_target);
  ASSERT_FALSE(cache_target.empty());
  std::unique_ptr<ChildProcess> decode =
      Cluster::Start({KVTIER_DECODE_BINARY, "--metrics-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--model",
                      *model_dir_, "--cache", cache_target},
                     decode_metrics, decode_target);
  ASSERT_FALSE(decode_target.empty());
  std::unique_ptr<ChildProcess> prefill =
      Cluster::Start({KVTIER_PREFILL_BINARY, "--metrics-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--model",
                      *model_dir_, "--cache", cache_target, "--decode", cache_target + "," + decode_target,
                      "--kv-codec", "bf16", "--tokens-per-block", std::to_string(kClusterBlock)},
                     prefill_metrics, prefill_target);
  ASSERT_FALSE(prefill_target.empty());
  v1::GenerateRequest request;
  for (uint32_t i = 0; i < kClusterBlock + 3; ++i) request.add_prompt_token_ids(i % 200);
  request.mutable_limits()->set_max_new_tokens(2);
  // Each generation starts at the next worker in turn: half start at the
  // cache.
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<cli::RemoteGeneration> got = cli::GenerateRemotely(prefill_target, request, absl::Minutes(2));
    EXPECT_TRUE(got.ok()) << i << ": " << got.status();
  }
}

TEST_F(DiscoveryTest, BadNamesAndServersAreUsageErrors) {
  for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
           {"--cache", "srv:"},
           {"--cache", "srv:name.test:7070"},
           {"--cache", "srv:_grpc._tcp.kvtier-cache.kvtier.test", "--dns-server", "localhost"},
           {"--cache", "srv:_grpc._tcp.kvtier-cache.kvtier.test", "--watch-interval-ms", "0"}}) {
    std::vector<std::string> argv = {KVTIER_DECODE_BINARY, "--model", *model_dir_, "--listen", "127.0.0.1:0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ChildProcess decode(argv);
    EXPECT_EQ(decode.Stop(0), 2) << flags[1];
  }
}

}  // namespace
}  // namespace kvtier
