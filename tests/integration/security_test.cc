// TLS and tenants on a real kvtier-cache: certificates made at test time
// with the openssl command line, servers on port 0, clients with gRPC's own
// TLS. Each attempt that must fail is followed by a good request on the
// same server, so a refusal is the attempt's, not a dead server's.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "services/base/child_process.h"
#include "services/base/metrics_page.h"
#include "services/cache/client/cache_client.h"
#include "services/cache/client/health_check.h"
#include "services/cache/client/shard_set.h"
#include "services/cache/fast_path/fast_path_socket.h"
#include "services/rpc/client_identity.h"
#include "tests/eventually.h"
#include "tests/integration/cache_test_blocks.h"
#include "tests/integration/delaying_proxy.h"
#include "tests/integration/list_services.h"
#include "tests/integration/test_certificates.h"
#include "tests/integration/test_tenants.h"
#include "tests/temp_dir.h"

namespace kvtier::cache {
namespace {

namespace fs = std::filesystem;
using testing::Contents;
using testing::TempDir;
using testing::TenantsJson;
using testing::TestCa;
using testing::TestTenant;

using testing::WriteAtomically;

// The names of the TLS metrics deploy/prometheus/rules.yml alerts on.
std::vector<std::string> TlsMetricsInRules() {
  const std::string text = Contents(fs::path(KVTIER_DEPLOY_DIR) / "prometheus/rules.yml");
  const std::regex metric("kvtier_tls_[a-z_]+");
  std::vector<std::string> names;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), metric); it != std::sregex_iterator(); ++it) {
    names.push_back(it->str());
  }
  return names;
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("kvtier-security-");
    ca_ = new TestCa(Dir("ca"), "kvtier test CA");
    TestCa other(Dir("other-ca"), "some other CA");
    ca_->Issue(Dir("server"), "cache-1", "DNS:localhost,IP:127.0.0.1");
    ca_->Issue(Dir("server-2"), "cache-2", "DNS:localhost,IP:127.0.0.1");
    ca_->Issue(Dir("client"), "acme client", "DNS:acme.clients.kvtier");
    ca_->Issue(Dir("expired-client"), "acme client", "DNS:acme.clients.kvtier", "20200101000000Z", "20200102000000Z");
    ca_->TrustOnly(Dir("trust"));
    other.TrustOnly(Dir("other-trust"));
    // A client of the other CA that trusts this one's servers.
    other.Issue(Dir("other-client"), "initech client", "DNS:initech.clients.kvtier");
    ca_->TrustOnly(Dir("other-client"));
  }
  static void TearDownTestSuite() {
    delete ca_;
    delete dir_;
  }

  static fs::path Dir(const std::string& name) { return *dir_ / name; }

  // A cache with `flags` on port 0; its address, or "" when it did not
  // start. With `metrics`, it serves /metrics too, there.
  std::string StartCache(std::vector<std::string> flags, std::string* metrics = nullptr) {
    if (metrics != nullptr) flags.insert(flags.end(), {"--metrics-listen", "127.0.0.1:0"});
    std::vector<std::string> argv = {KVTIER_CACHE_BINARY,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--metrics-listen",
                                     "",
                                     "--device-capacity",
                                     "16MiB",
                                     "--host-capacity",
                                     "16MiB",
                                     "--reload-seconds",
                                     "1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    caches_.push_back(std::make_unique<ChildProcess>(argv));
    if (metrics != nullptr) {
      const std::optional<std::string> line = caches_.back()->WaitForLine("metrics on ");
      *metrics = line ? line->substr(0, line->find('/')) : "";
    }
    const int port = caches_.back()->WaitForListeningPort();
    return port > 0 ? absl::StrCat("127.0.0.1:", port) : "";
  }

  // A client of `target` over TLS trusting (and presenting) `tls_dir`'s
  // files ("" for plaintext), carrying `token` ("" for none).
  static CacheClient Client(const std::string& target, const std::string& tls_dir, const std::string& token = "") {
    ClientIdentityOptions identity;
    identity.tls.dir = tls_dir.empty() ? "" : Dir(tls_dir).string();
    if (!token.empty()) identity.token_file = testing::WriteTokenFile(dir_->path(), token);
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannelAs(identity, target);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return CacheClient(*channel, absl::Seconds(5));
  }

  static absl::StatusCode StatsCode(CacheClient& client) { return client.Stats().status().code(); }
  static absl::StatusCode StatsCode(CacheClient&& client) { return StatsCode(client); }

  // Once a new channel of `cut`'s certificate is refused, with a cache at a
  // connection age of 2 s: the channel `cut` opened before is refused at
  // once (each call checks its certificate again), answers UNAVAILABLE
  // within 10 s (its connection aged out, a new handshake refused) and
  // stays refused over two more ages, while every call of `kept` (of the
  // same server, still trusted) succeeds.
  static void ExpectCutOff(CacheClient& kept, CacheClient& cut) {
    EXPECT_NE(StatsCode(cut), absl::StatusCode::kOk) << "a call after the change was served";
    const auto taken = std::chrono::steady_clock::now();
    size_t kept_calls = 0;
    EXPECT_TRUE(testing::Eventually(
        [&] {
          EXPECT_EQ(StatsCode(kept), absl::StatusCode::kOk) << "a trusted client lost a call to a reconnection";
          ++kept_calls;
          return StatsCode(cut) == absl::StatusCode::kUnavailable;
        },
        std::chrono::seconds(20)))
        << "a connection made before the change was not closed";
    EXPECT_LT(std::chrono::steady_clock::now() - taken, std::chrono::seconds(10));
    const auto later = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < later) {
      EXPECT_EQ(StatsCode(kept), absl::StatusCode::kOk) << "a trusted client lost a call to a reconnection";
      EXPECT_EQ(StatsCode(cut), absl::StatusCode::kUnavailable);
      ++kept_calls;
    }
    EXPECT_GT(kept_calls, 10u);
  }

  // Puts in `live` (a cache's --tls-dir) a list of the test CA revoking
  // the certificate of client `client` (a directory under Dir), issued at
  // `this_update` and due at `next_update` (the CA's later lists revoke
  // nothing); whether `target` refuses a new handshake of it within 20 s.
  bool Revoke(const std::string& target, const std::string& client, const fs::path& live, int64_t this_update,
              int64_t next_update) {
    const fs::path crl = Dir(absl::StrCat(client, "-", this_update, ".crl"));
    ca_->Revoke(Dir(client) / "tls.crt");
    ca_->WriteCrl(crl, this_update, next_update);
    ca_->ReinstateAll();
    WriteAtomically(live / "ca.crl", Contents(crl));
    return testing::Eventually([&] { return StatsCode(Client(target, client)) != absl::StatusCode::kOk; },
                               std::chrono::seconds(20));
  }

  // Starts a cache with `flags`, stores `acme_blocks` blocks as `acme` (the
  // first, returned) and `globex_blocks` as globex, then stops it by
  // SIGTERM with the clients closed (a stop waits for idle ones to read
  // its GOAWAY).
  std::vector<TestBlock> StoreThenStop(const std::vector<std::string>& flags, const TestTenant& acme, int acme_blocks,
                                       int globex_blocks);

  static inline TempDir* dir_ = nullptr;
  static inline TestCa* ca_ = nullptr;
  std::vector<std::unique_ptr<ChildProcess>> caches_;
};

const TestTenant kAdmin{"ops", "ADMIN", "", "admin-token-7f3a"};
const TestTenant kAcme{"acme", "WRITER", "acme", "acme-token-91c2", "acme.clients.kvtier"};
const TestTenant kGlobex{"globex", "WRITER", "globex", "globex-token-44d0"};
const TestTenant kAuditor{"auditor", "READER", "acme", "auditor-token-0b17"};

// A TLS directory or tenants file that cannot be used, a reload period
// that would spin or more threads than a process can start stops the
// server at once, exit 2, saying which and why: before its tiers are made
// or its metrics served.
TEST_F(SecurityTest, UnusableTlsOrTenantsFilesAreUsageErrors) {
  const fs::path bad = Dir("bad-tenants.json");
  std::ofstream(bad) << R"({"tenants": [{"name": "x", "namespaces": ["x"], "tokenSha256": ["00"]}]})";
  for (const auto& [flags, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--tls-dir", Dir("missing").string()}, "cannot read " + (Dir("missing") / "ca.crt").string()},
           {{"--tenants", bad.string()}, "no role"},
           {{"--tenants", Dir("missing.json").string()}, "cannot read"},
           {{"--reload-seconds", "0"}, "--reload-seconds 0: must be 1 to 86400"},
           {{"--threads", "100000"}, "--threads 100000: must be 1 to 1024"}}) {
    std::string command =
        std::string(KVTIER_CACHE_BINARY) +
        " --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --device-capacity 16MiB --host-capacity 16MiB";
    for (const std::string& f : flags) command += " " + f;
    const CommandResult r = RunCommand(command);
    EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("listening on"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("metrics on"), std::string::npos) << r.output;
  }
}

// The connection attempts that must fail, each with its status and then a
// good request on the same server (printed as a table).
TEST_F(SecurityTest, BadConnectionAttemptsAreRefusedAndGoodOnesServed) {
  const fs::path tenants = Dir("tenants-attempts.json");
  std::ofstream(tenants) << TenantsJson({kAdmin, kAcme});
  const std::string tls = StartCache({"--tls-dir", Dir("server").string(), "--tenants", tenants.string()});
  const std::string mtls =
      StartCache({"--tls-dir", Dir("server").string(), "--tls-require-client-cert", "--tenants", tenants.string()});
  ASSERT_FALSE(tls.empty());
  ASSERT_FALSE(mtls.empty());

  struct Attempt {
    std::string what;
    absl::StatusCode expected;
    std::function<absl::StatusCode()> attempt, good;
  };
  const auto good_tls = [&] { return StatsCode(Client(tls, "trust", kAdmin.token)); };
  const auto good_mtls = [&] { return StatsCode(Client(mtls, "client", kAdmin.token)); };
  // A Stats call over TLS whose authorization header is `authorization`.
  const auto with_header = [&](const std::string& authorization) {
    CacheClient client = Client(tls, "trust");
    grpc::ClientContext context;
    client.SetDeadline(context);
    context.AddMetadata("authorization", authorization);
    v1::StatsResponse response;
    return static_cast<absl::StatusCode>(client.stub().Stats(&context, v1::StatsRequest(), &response).error_code());
  };
  std::vector<Attempt> attempts = {
      {"plaintext client to a TLS server", absl::StatusCode::kUnavailable,
       [&] { return StatsCode(Client(tls, "", kAdmin.token)); }, good_tls},
      {"client trusting another CA", absl::StatusCode::kUnavailable,
       [&] { return StatsCode(Client(tls, "other-trust", kAdmin.token)); }, good_tls},
      {"no token and no client certificate", absl::StatusCode::kUnauthenticated,
       [&] { return StatsCode(Client(tls, "trust")); }, good_tls},
      {"a token no tenant has", absl::StatusCode::kUnauthenticated,
       [&] { return StatsCode(Client(tls, "trust", "not-a-token")); }, good_tls},
      {"a tenant's token under another scheme", absl::StatusCode::kUnauthenticated,
       [&] { return with_header("Token  " + kAdmin.token); }, good_tls},
      {"a tenant's token alone", absl::StatusCode::kUnauthenticated, [&] { return with_header(kAdmin.token); },
       good_tls},
      {"a tenant's token, the scheme in lower case", absl::StatusCode::kOk,
       [&] { return with_header("bearer " + kAdmin.token); }, good_tls},
      {"mutual TLS without a client certificate", absl::StatusCode::kUnavailable,
       [&] { return StatsCode(Client(mtls, "trust", kAdmin.token)); }, good_mtls},
      {"mutual TLS with an expired client certificate", absl::StatusCode::kUnavailable,
       [&] { return StatsCode(Client(mtls, "expired-client", kAdmin.token)); }, good_mtls},
  };
  std::ostringstream table;
  const auto row = [&](const std::string& what, const std::string& status, const std::string& then) {
    table << absl::StrFormat("%-50s %-17s %s\n", what, status, then);
  };
  row("attempt", "status", "then a good request");
  for (const Attempt& a : attempts) {
    const absl::StatusCode got = a.attempt(), then = a.good();
    row(a.what, absl::StatusCodeToString(got), absl::StatusCodeToString(then));
    EXPECT_EQ(got, a.expected) << a.what;
    EXPECT_EQ(then, absl::StatusCode::kOk) << "after: " << a.what;
  }

  // A client certificate proves its tenant: acme's certificate with no
  // token reads acme's namespace and no other.
  CacheClient by_cert = Client(mtls, "client");
  EXPECT_TRUE(by_cert.Match("acme", TestLayout(), {}).ok());
  EXPECT_EQ(by_cert.Match("globex", TestLayout(), {}).status().code(), absl::StatusCode::kPermissionDenied);

  // A token taken out of the tenants file while the server runs: refused
  // once the file is read again, and the others still served.
  CacheClient acme = Client(tls, "trust", kAcme.token);
  const absl::StatusCode before = acme.Match("acme", TestLayout(), {}).status().code();
  WriteAtomically(tenants, TenantsJson({kAdmin}));
  const bool refused = testing::Eventually(
      [&] { return acme.Match("acme", TestLayout(), {}).status().code() == absl::StatusCode::kUnauthenticated; });
  const absl::StatusCode then = good_tls();
  row("a token removed from the tenants file", refused ? "UNAUTHENTICATED" : "still served",
      absl::StatusCodeToString(then));
  EXPECT_EQ(before, absl::StatusCode::kOk);
  EXPECT_TRUE(refused);
  EXPECT_EQ(then, absl::StatusCode::kOk);
  std::cout << table.str();
}

// Behind TLS, kubelet's gRPC probes (which speak no TLS) read health from
// --health-listen: plaintext, and nothing but health there.
TEST_F(SecurityTest, PlaintextHealthPortServesOnlyHealth) {
  caches_.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
      KVTIER_CACHE_BINARY, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--device-capacity", "16MiB",
      "--host-capacity", "16MiB", "--tls-dir", Dir("server").string(), "--health-listen", "127.0.0.1:0"}));
  const std::optional<std::string> health = caches_.back()->WaitForLine("health on ");
  ASSERT_TRUE(health.has_value());
  ASSERT_GT(caches_.back()->WaitForListeningPort(), 0);
  auto channel = grpc::CreateChannel(*health, grpc::InsecureChannelCredentials());
  const absl::Status checked = CheckHealth(channel, absl::Seconds(5));
  EXPECT_TRUE(checked.ok()) << checked << " (SERVING expected)";
  EXPECT_EQ(StatsCode(CacheClient(channel, absl::Seconds(5))), absl::StatusCode::kUnimplemented)
      << "the plaintext port serves more than health";
  grpc::GenericStub generic(channel);
  ListServices reflection(generic);
  const std::string listing = reflection.Wait();
  EXPECT_EQ(reflection.status().error_code(), grpc::StatusCode::UNIMPLEMENTED)
      << "the plaintext port serves reflection: " << listing;
}

// The health a ShardSet with `deadline` finds of the one shard at
// `target`, and how long the check took.
std::pair<ShardSet::Health, absl::Duration> CheckOneShard(const std::string& target, absl::Duration deadline) {
  auto shards = ShardSet::Create(target, deadline, false);
  EXPECT_TRUE(shards.ok()) << shards.status();
  if (!shards.ok()) return {ShardSet::Health::kDown, absl::ZeroDuration()};
  const absl::Time start = absl::Now();
  (*shards)->CheckHealth();
  return {(*shards)->HealthOfShards()[0].second, absl::Now() - start};
}

int PortOf(const std::string& target) { return std::stoi(target.substr(target.rfind(':') + 1)); }

// A shard whose TLS handshake outlasts the cache deadline is up: its
// health check gives connecting time of its own (at least a second), and
// the deadline to the check's call.
TEST_F(SecurityTest, AShardWhoseHandshakeOutlastsTheCacheDeadlineIsUp) {
  const std::string target = StartCache({"--tls-dir", Dir("server").string()});
  ASSERT_FALSE(target.empty());
  testing::DelayingProxy slow(PortOf(target), absl::Milliseconds(400));
  ASSERT_GT(slow.port(), 0);
  ASSERT_TRUE(SetClientIdentity({.tls = {.dir = Dir("trust").string()}, .token_file = ""}).ok());
  const auto [health, took] = CheckOneShard(absl::StrCat("127.0.0.1:", slow.port()), absl::Milliseconds(100));
  EXPECT_GE(took, absl::Milliseconds(400)) << "the proxy held the handshake";
  EXPECT_EQ(health, ShardSet::Health::kUp);
  // Refused at once: down at once, not after the time to connect.
  const auto [refused, refused_took] = CheckOneShard("127.0.0.1:1", absl::Seconds(5));
  EXPECT_EQ(refused, ShardSet::Health::kDown);
  EXPECT_LT(refused_took, absl::Seconds(1));
  ASSERT_TRUE(SetClientIdentity({}).ok());
}

// A shard that answers its health check later than the cache deadline is
// up too: the deadline bounds each call the shard serves, and marking it
// down would make every block on it a miss until the next check.
TEST_F(SecurityTest, AShardThatAnswersLaterThanTheCacheDeadlineIsUp) {
  const std::string target = StartCache({});
  ASSERT_FALSE(target.empty());
  testing::DelayingProxy slow(PortOf(target), absl::ZeroDuration(), /*answer_delay=*/absl::Milliseconds(150));
  ASSERT_GT(slow.port(), 0);
  const auto [health, took] = CheckOneShard(absl::StrCat("127.0.0.1:", slow.port()), absl::Milliseconds(50));
  EXPECT_GE(took, absl::Milliseconds(150)) << "the proxy held the answer";
  EXPECT_EQ(health, ShardSet::Health::kUp);
}

// The common name of the certificate a new connection to `target` is
// served with.
std::string ServedCommonName(const std::string& target, const fs::path& trust) {
  ClientIdentityOptions identity;
  identity.tls.dir = trust.string();
  auto channel = MakeChannelAs(identity, target);
  if (!channel.ok()) return "";
  auto stub = v1::KvCache::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::StatsResponse response;
  stub->Stats(&context, v1::StatsRequest(), &response);
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return "";
  for (const grpc::string_ref& cn : auth->FindPropertyValues("x509_common_name"))
    return std::string(cn.data(), cn.size());
  return "";
}

// New certificate files under a running cache: new connections get them,
// a stream open on an old connection finishes, no restart.
TEST_F(SecurityTest, RotatedCertificatesServeNewConnectionsWhileOpenStreamsFinish) {
  const fs::path live = Dir("rotating");
  fs::create_directories(live);
  for (const char* f : {"ca.crt", "tls.crt", "tls.key"}) {
    fs::copy_file(Dir("server") / f, live / f, fs::copy_options::overwrite_existing);
  }
  const std::string target = StartCache({"--tls-dir", live.string()});
  ASSERT_FALSE(target.empty());
  EXPECT_EQ(ServedCommonName(target, Dir("trust")), "cache-1");

  CacheClient client = Client(target, "trust");
  const std::vector<TestBlock> blocks = StoreBlocks(client, TestLayout(), "tenant", 1, 24);
  // A Get stream opened now, read one block, then the files change.
  ClientIdentityOptions identity;
  identity.tls.dir = Dir("trust").string();
  auto channel = *MakeChannelAs(identity, target);
  auto stub = v1::KvCache::NewStub(channel);
  grpc::ClientContext context;
  auto reader = stub->Get(&context, MakeGetRequest("tenant", TestLayout(), Hashes(blocks)));
  v1::GetResponse response;
  ASSERT_TRUE(reader->Read(&response));
  size_t read = 1;

  for (const char* f : {"tls.key", "tls.crt"}) {
    WriteAtomically(live / f, Contents(Dir("server-2") / f));
  }
  EXPECT_TRUE(testing::Eventually([&] { return ServedCommonName(target, Dir("trust")) == "cache-2"; },
                                  std::chrono::seconds(20)))
      << "new connections still get the old certificate";
  while (reader->Read(&response)) ++read;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(read, blocks.size()) << "the stream open across the rotation lost blocks";
}

// Files under a running cache that are not a whole certificate and key
// (an empty key, an empty certificate renamed in, a garbage certificate, the
// new certificate beside the old key) are refused, counted and logged; the
// cache keeps serving new connections with the last good pair, and takes
// the new pair once it is whole.
TEST_F(SecurityTest, TlsFilesThatAreNotWholeKeepTheLastGoodPairServing) {
  const fs::path live = Dir("rotating-badly");
  fs::create_directories(live);
  for (const char* f : {"ca.crt", "tls.crt", "tls.key"}) {
    fs::copy_file(Dir("server") / f, live / f, fs::copy_options::overwrite_existing);
  }
  std::string metrics;
  const std::string target = StartCache({"--tls-dir", live.string()}, &metrics);
  ASSERT_FALSE(target.empty());
  const std::string rejected = absl::StrCat("kvtier_tls_files_rejected_total{dir=\"", live.string(), "\"}");
  const std::string in_force = absl::StrCat("kvtier_tls_files_in_force{dir=\"", live.string(), "\"}");
  EXPECT_EQ(MetricValue(ScrapeMetrics(metrics), in_force), 1);
  const std::string old_key = Contents(Dir("server") / "tls.key");
  const std::vector<std::pair<std::string, std::function<void()>>> bad = {
      {"tls.key truncated in place", [&] { std::ofstream(live / "tls.key", std::ios::trunc); }},
      {"an empty tls.crt renamed in",
       [&] {
         WriteAtomically(live / "tls.key", old_key);
         WriteAtomically(live / "tls.crt", "");
       }},
      {"a garbage tls.crt", [&] { WriteAtomically(live / "tls.crt", "-----BEGIN CERTIFICATE-----\nnot one\n"); }},
      {"the new tls.crt beside the old tls.key",
       [&] { WriteAtomically(live / "tls.crt", Contents(Dir("server-2") / "tls.crt")); }},
  };
  double refused = 0;
  for (const auto& [what, change] : bad) {
    change();
    ++refused;
    EXPECT_TRUE(testing::Eventually([&] { return MetricValue(ScrapeMetrics(metrics), rejected) >= refused; },
                                    std::chrono::seconds(10)))
        << what << ": not refused";
    const std::string page = ScrapeMetrics(metrics);
    EXPECT_EQ(MetricValue(page, in_force), 0) << what;
    EXPECT_EQ(ServedCommonName(target, Dir("trust")), "cache-1") << what << ": new connections lost the last good pair";
  }
  // The rotation completed: the new key beside the new certificate.
  WriteAtomically(live / "tls.key", Contents(Dir("server-2") / "tls.key"));
  EXPECT_TRUE(testing::Eventually([&] { return ServedCommonName(target, Dir("trust")) == "cache-2"; },
                                  std::chrono::seconds(20)))
      << "the whole new pair was not taken";
  const std::string page = ScrapeMetrics(metrics);
  EXPECT_EQ(MetricValue(page, in_force), 1);
  EXPECT_EQ(MetricValue(page, rejected), refused);
  EXPECT_GT(
      MetricValue(page, absl::StrCat("kvtier_tls_certificate_expiry_timestamp_seconds{dir=\"", live.string(), "\"}"))
          .value_or(0),
      static_cast<double>(std::time(nullptr)));
  // The alerting rules name only TLS metrics a TLS server exports (those
  // of revocation lists, with a ca.crl: ARevokedClient... checks them).
  size_t names = 0;
  for (const std::string& name : TlsMetricsInRules()) {
    if (name.starts_with("kvtier_tls_crl_")) continue;
    EXPECT_NE(page.find("\n" + name + "{"), std::string::npos) << "rules.yml uses " << name;
    ++names;
  }
  EXPECT_GE(names, 2u);
}

// gRPC checks a client's certificate at the handshake only. Once the CA
// that signed it is dropped from ca.crt, the calls of a client of that CA
// are refused at the reload, and --max-connection-age-seconds ends the
// connection it opened before (a GOAWAY), the next one refused at its
// handshake. A client still trusted loses no call to the reconnections,
// and a stream it has open across them finishes whole.
TEST_F(SecurityTest, AClientOfADroppedCaIsCutOffAtTheReload) {
  const fs::path live = Dir("two-cas");
  fs::create_directories(live);
  for (const char* f : {"tls.crt", "tls.key"}) {
    fs::copy_file(Dir("server") / f, live / f, fs::copy_options::overwrite_existing);
  }
  const std::string our_ca = Contents(Dir("trust") / "ca.crt");
  WriteAtomically(live / "ca.crt", our_ca + Contents(Dir("other-trust") / "ca.crt"));
  const std::string target =
      StartCache({"--tls-dir", live.string(), "--tls-require-client-cert", "--max-connection-age-seconds", "2"});
  ASSERT_FALSE(target.empty());
  CacheClient acme = Client(target, "client");
  CacheClient initech = Client(target, "other-client");
  ASSERT_EQ(StatsCode(acme), absl::StatusCode::kOk);
  ASSERT_EQ(StatsCode(initech), absl::StatusCode::kOk);
  // A Get of a block many times over (more than flow control lets the
  // cache send ahead) on acme's connection, one answer read.
  const std::vector<TestBlock> blocks = StoreBlocks(acme, TestLayout(), "tenant", 1, 1);
  constexpr size_t kCopies = 256;
  grpc::ClientContext context;
  auto reader = acme.stub().Get(
      &context,
      MakeGetRequest("tenant", TestLayout(), std::vector<kvblock::BlockHash>(kCopies, blocks[0].slices.hash)));
  v1::GetResponse response;
  ASSERT_TRUE(reader->Read(&response));
  size_t read = 1;

  WriteAtomically(live / "ca.crt", our_ca);
  ASSERT_TRUE(testing::Eventually([&] { return StatsCode(Client(target, "other-client")) != absl::StatusCode::kOk; },
                                  std::chrono::seconds(20)))
      << "the new ca.crt was not taken";
  ExpectCutOff(acme, initech);
  while (reader->Read(&response)) {
    EXPECT_EQ(response.data(), blocks[0].record);
    ++read;
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(read, kCopies) << "the stream open across the connection's age lost answers";
}

// A client certificate revoked by a ca.crl written under a running cache
// is refused at its next handshake and its next call, and the connection
// it has open ends within --max-connection-age-seconds; another client of
// the same CA loses no call. A newer list without it lets it in again, and a rotation of the
// server's certificate lifts no revocation. The list's next update is
// exported, for the alert that asks for a newer list in time.
TEST_F(SecurityTest, ARevokedClientIsCutOffAtTheReloadAndANewerListLetsItIn) {
  ca_->Issue(Dir("revoked-client"), "wayne client", "DNS:wayne.clients.kvtier");
  const fs::path live = Dir("revoking");
  fs::create_directories(live);
  for (const char* f : {"ca.crt", "tls.crt", "tls.key"}) {
    fs::copy_file(Dir("server") / f, live / f, fs::copy_options::overwrite_existing);
  }
  std::string metrics;
  const std::string target = StartCache(
      {"--tls-dir", live.string(), "--tls-require-client-cert", "--max-connection-age-seconds", "2"}, &metrics);
  ASSERT_FALSE(target.empty());
  CacheClient acme = Client(target, "client");
  CacheClient wayne = Client(target, "revoked-client");
  ASSERT_EQ(StatsCode(acme), absl::StatusCode::kOk);
  ASSERT_EQ(StatsCode(wayne), absl::StatusCode::kOk);
  const std::string crl_due = absl::StrCat("kvtier_tls_crl_next_update_timestamp_seconds{dir=\"", live.string(), "\"}");
  EXPECT_EQ(MetricValue(ScrapeMetrics(metrics), crl_due), std::nullopt);

  const int64_t now = std::time(nullptr);
  ASSERT_TRUE(Revoke(target, "revoked-client", live, now - 120, now + 3600)) << "the revocation list was not taken";
  ExpectCutOff(acme, wayne);
  const std::string page = ScrapeMetrics(metrics);
  EXPECT_EQ(MetricValue(page, crl_due), static_cast<double>(now + 3600));
  for (const std::string& name : TlsMetricsInRules()) {
    EXPECT_NE(page.find("\n" + name + "{"), std::string::npos) << "rules.yml uses " << name;
  }

  ca_->WriteCrl(Dir("lifting.crl"), now - 60, now + 7200);
  WriteAtomically(live / "ca.crl", Contents(Dir("lifting.crl")));
  EXPECT_TRUE(testing::Eventually([&] { return StatsCode(Client(target, "revoked-client")) == absl::StatusCode::kOk; },
                                  std::chrono::seconds(20)))
      << "a newer list without the certificate did not let it in";
  EXPECT_EQ(StatsCode(acme), absl::StatusCode::kOk);
  EXPECT_EQ(MetricValue(ScrapeMetrics(metrics), crl_due), static_cast<double>(now + 7200));

  // Revoked again, then the server's certificate rotated: gRPC makes a new
  // SSL context, which reads every list of the CA afresh and applies the
  // newest; the rotation lifts nothing.
  ASSERT_TRUE(Revoke(target, "revoked-client", live, now - 30, now + 7200)) << "the third list was not taken";
  WriteAtomically(live / "tls.crt", Contents(Dir("server-2") / "tls.crt"));
  WriteAtomically(live / "tls.key", Contents(Dir("server-2") / "tls.key"));
  EXPECT_TRUE(testing::Eventually([&] { return ServedCommonName(target, Dir("client")) == "cache-2"; },
                                  std::chrono::seconds(20)))
      << "the new pair was not taken";
  EXPECT_NE(StatsCode(Client(target, "revoked-client")), absl::StatusCode::kOk) << "a certificate rotation lifted it";
  EXPECT_EQ(StatsCode(Client(target, "client")), absl::StatusCode::kOk);
}

// A same-host fast path session and a stream outlive the handshake of the
// connection that opened them: once a ca.crl revokes the client's
// certificate, its session ends at the reload (its connection closed, its
// lease's blocks unpinned), as new handshakes of that client are refused;
// its still open channel is refused every call (UNAUTHENTICATED, naming
// the certificate), and its open Get and Put streams end at their next
// block or message (UNAUTHENTICATED, the begun block dropped). Another
// client of the same CA reads on, its Get stream whole.
TEST_F(SecurityTest, AFastPathSessionAndStreamsEndWhenTheirClientsCertificateIsRevoked) {
  ca_->Issue(Dir("fast-wayne"), "fast wayne client", "DNS:fast-wayne.clients.kvtier");
  const fs::path live = Dir("revoking-fast");
  fs::create_directories(live);
  for (const char* f : {"ca.crt", "tls.crt", "tls.key"}) {
    fs::copy_file(Dir("server") / f, live / f, fs::copy_options::overwrite_existing);
  }
  const std::string target = StartCache({"--tls-dir", live.string(), "--tls-require-client-cert"});
  ASSERT_FALSE(target.empty());
  CacheClient acme = Client(target, "client");
  CacheClient wayne = Client(target, "fast-wayne");
  const std::vector<TestBlock> blocks = StoreBlocks(acme, TestLayout(), "tenant", 1, 2);
  struct Session {
    v1::OpenFastPathResponse opened;
    int socket = -1;
    ~Session() { close(socket); }
  };
  const auto open = [](CacheClient& client, Session& session) {
    grpc::ClientContext context;
    const grpc::Status opened = client.stub().OpenFastPath(&context, {}, &session.opened);
    if (!opened.ok()) return opened.error_code();
    session.socket = *fastpath::Connect(session.opened.socket_path());
    fastpath::Request hello{fastpath::RequestKind::kHello};
    hello.session_id = session.opened.session_id();
    std::memcpy(hello.secret.data(), session.opened.secret().data(), hello.secret.size());
    int fd = -1;
    EXPECT_TRUE(fastpath::SendRequest(session.socket, hello).ok());
    EXPECT_TRUE(fastpath::ReceiveReply(session.socket, fd).ok());
    return grpc::StatusCode::OK;
  };
  const auto lease = [](CacheClient& client, const Session& session, const TestBlock& block) {
    v1::LeaseBlocksRequest request;
    request.set_session_id(session.opened.session_id());
    request.set_kv_namespace("tenant");
    *request.mutable_layout() = kvblock::LayoutToProto(TestLayout());
    request.add_block_hashes(std::string(kvblock::HashAsBytes(block.slices.hash)));
    request.set_lease_ttl_ms(60000);
    grpc::ClientContext context;
    v1::LeaseBlocksResponse response;
    return client.stub().LeaseBlocks(&context, request, &response).error_code();
  };
  const auto stats = [&acme] { return acme.Stats().value_or(v1::StatsResponse()); };
  Session acme_session, wayne_session;
  ASSERT_EQ(open(acme, acme_session), grpc::StatusCode::OK);
  ASSERT_EQ(open(wayne, wayne_session), grpc::StatusCode::OK);
  ASSERT_EQ(lease(acme, acme_session, blocks[0]), grpc::StatusCode::OK);
  ASSERT_EQ(lease(wayne, wayne_session, blocks[1]), grpc::StatusCode::OK);
  ASSERT_EQ(stats().fast_path_sessions(), 2u);
  ASSERT_EQ(stats().pinned_blocks(), 2u);
  // A Put of wayne's, one block whole and one begun; a Get each of a block
  // many times over (more than flow control lets the cache send ahead),
  // one answer read.
  const kvblock::LatentLayout layout = TestLayout();
  const std::vector<TestBlock> put_blocks = {MakeBlock(layout, "tenant", 7), MakeBlock(layout, "tenant", 8)};
  grpc::ClientContext put_context;
  v1::PutResponse put_response;
  auto writer = wayne.stub().Put(&put_context, &put_response);
  ASSERT_TRUE(writer->Write(HeaderMessage("tenant", layout)));
  for (uint32_t l = 0; l < layout.num_layers; ++l) ASSERT_TRUE(writer->Write(SliceMessage(put_blocks[0], l)));
  ASSERT_TRUE(writer->Write(SliceMessage(put_blocks[1], 0)));
  constexpr size_t kCopies = 256;
  struct Read {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::GetResponse>> reader;
    size_t answers = 0;
  };
  Read acme_read, wayne_read;
  for (auto [client, read] : {std::pair{&acme, &acme_read}, {&wayne, &wayne_read}}) {
    read->reader = client->stub().Get(
        &read->context,
        MakeGetRequest("tenant", layout, std::vector<kvblock::BlockHash>(kCopies, blocks[0].slices.hash)));
    v1::GetResponse answer;
    ASSERT_TRUE(read->reader->Read(&answer));
    ++read->answers;
  }

  const int64_t now = std::time(nullptr);
  ASSERT_TRUE(Revoke(target, "fast-wayne", live, now - 120, now + 3600)) << "the revocation list was not taken";
  EXPECT_TRUE(testing::Eventually([&] { return stats().fast_path_sessions() == 1u; }, std::chrono::seconds(2)))
      << "the revoked client's session outlived the reload";
  EXPECT_EQ(stats().pinned_blocks(), 1u) << "its lease still pins its block";
  char byte;
  EXPECT_EQ(recv(wayne_session.socket, &byte, 1, MSG_DONTWAIT), 0) << "its connection is still open";
  // Its channel predates the list (no connection age set): refused all the same.
  const absl::Status call = wayne.Stats().status();
  EXPECT_EQ(call.code(), absl::StatusCode::kUnauthenticated) << call;
  EXPECT_NE(call.message().find("the certificate of CN=fast wayne client: certificate revoked"), std::string::npos)
      << call;
  Session refused;
  EXPECT_EQ(open(wayne, refused), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(lease(acme, acme_session, blocks[1]), grpc::StatusCode::OK);
  Session again;
  EXPECT_EQ(open(acme, again), grpc::StatusCode::OK);

  for (uint32_t l = 1; l < layout.num_layers; ++l) {
    if (!writer->Write(SliceMessage(put_blocks[1], l))) break;  // ended by the cache: Finish says why
  }
  writer->WritesDone();
  const grpc::Status put = writer->Finish();
  EXPECT_EQ(put.error_code(), grpc::StatusCode::UNAUTHENTICATED) << put.error_message();
  EXPECT_NE(put.error_message().find("certificate revoked"), std::string::npos) << put.error_message();
  EXPECT_EQ(acme.Match("tenant", layout, Hashes(put_blocks))->matched_blocks(), 1u);
  for (auto [read, ends] :
       {std::pair{&acme_read, grpc::StatusCode::OK}, {&wayne_read, grpc::StatusCode::UNAUTHENTICATED}}) {
    for (v1::GetResponse answer; read->reader->Read(&answer);) ++read->answers;
    const grpc::Status status = read->reader->Finish();
    EXPECT_EQ(status.error_code(), ends) << status.error_message();
    if (status.ok()) {
      EXPECT_EQ(read->answers, kCopies);
    } else {
      EXPECT_LT(read->answers, kCopies);
    }
  }
}

// A client with a ca.crl checks the server's certificate against it.
TEST_F(SecurityTest, AClientRefusesAServerWhoseCertificateItsCaCrlRevokes) {
  ca_->Issue(Dir("server-3"), "cache-3", "DNS:localhost,IP:127.0.0.1");
  const std::string target = StartCache({"--tls-dir", Dir("server-3").string()});
  ASSERT_FALSE(target.empty());
  const fs::path wary = Dir("wary-client");
  fs::create_directories(wary);
  fs::copy_file(Dir("trust") / "ca.crt", wary / "ca.crt", fs::copy_options::overwrite_existing);
  const int64_t now = std::time(nullptr);
  ca_->Revoke(Dir("server-3") / "tls.crt");
  ca_->WriteCrl(wary / "ca.crl", now - 60, now + 3600);
  ca_->ReinstateAll();
  EXPECT_EQ(StatsCode(Client(target, "wary-client")), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatsCode(Client(target, "trust")), absl::StatusCode::kOk);
  // The same list, of a certificate not revoked: served.
  EXPECT_EQ(StatsCode(Client(StartCache({"--tls-dir", Dir("server").string()}), "wary-client")), absl::StatusCode::kOk);
}

// A client's --token-file is read again as it changes: rotated in the
// order docs/operations.md gives (the new token's hash beside the old one,
// the file, then the old hash out), the client loses no call and needs no
// restart, while one still holding the old token is refused once its hash
// is gone. A token file emptied meanwhile keeps the last good token.
TEST_F(SecurityTest, ATokenFileRotatedUnderARunningClientIsFollowed) {
  const std::string new_token = "acme-token-new-5e21";
  TestTenant both = kAcme, rotated = kAcme;
  both.more_tokens = {new_token};
  rotated.token = new_token;
  const fs::path tenants = Dir("tenants-token-rotation.json");
  std::ofstream(tenants) << TenantsJson({kAdmin, both});
  const std::string target = StartCache({"--tenants", tenants.string()});
  ASSERT_FALSE(target.empty());
  const fs::path token = Dir("rotating-token");
  WriteAtomically(token, kAcme.token + "\n");
  ClientIdentityOptions identity;
  identity.tls.reload_seconds = 1;
  identity.token_file = token.string();
  CacheClient follows(*MakeChannelAs(identity, target), absl::Seconds(5));
  CacheClient stays = Client(target, "", kAcme.token);
  const std::vector<TestBlock> blocks = StoreBlocks(follows, TestLayout(), "acme", 1, 1);
  auto match = [&](CacheClient& client) { return client.Match("acme", TestLayout(), Hashes(blocks)).status().code(); };
  // Calls for a while, each of which must be served.
  auto served_for = [&](absl::Duration period) {
    for (const absl::Time end = absl::Now() + period; absl::Now() < end; absl::SleepFor(absl::Milliseconds(50))) {
      ASSERT_EQ(match(follows), absl::StatusCode::kOk);
    }
  };
  ASSERT_EQ(match(stays), absl::StatusCode::kOk);

  WriteAtomically(token, "");
  served_for(absl::Milliseconds(2500));
  WriteAtomically(token, new_token + "\n");
  served_for(absl::Milliseconds(2500));
  WriteAtomically(tenants, TenantsJson({kAdmin, rotated}));
  EXPECT_TRUE(testing::Eventually(
      [&] {
        EXPECT_EQ(match(follows), absl::StatusCode::kOk) << "the rotated client lost a call";
        return match(stays) == absl::StatusCode::kUnauthenticated;
      },
      std::chrono::seconds(20)))
      << "the old token was not refused";
  served_for(absl::Seconds(1));
}

// What gRPC core and protobuf log goes through kvtier's log, rate-limited:
// a flood of requests that protobuf complains about (a string field that
// is not UTF-8), sent without a token, makes a line or two, not one each;
// a plaintext client at the TLS port gets a line that says so, and the CLI
// in its place a hint.
TEST_F(SecurityTest, LibraryLogLinesAreExplainedAndRateLimited) {
  const fs::path tenants = Dir("tenants-flood.json");
  std::ofstream(tenants) << TenantsJson({kAdmin, kAcme});
  const fs::path log = Dir("flood.log");
  ChildProcess cache({"/bin/sh", "-c",
                      absl::StrCat("exec ", KVTIER_CACHE_BINARY,
                                   " --listen 127.0.0.1:0 --metrics-listen '' --device-capacity 16MiB"
                                   " --host-capacity 16MiB --tls-dir ",
                                   Dir("server").string(), " --tenants ", tenants.string(), " 2>", log.string())});
  const int port = cache.WaitForListeningPort();
  ASSERT_GT(port, 0);
  const std::string target = absl::StrCat("127.0.0.1:", port);
  ClientIdentityOptions identity;
  identity.tls.dir = Dir("trust").string();
  std::shared_ptr<grpc::Channel> channel = *MakeChannelAs(identity, target);
  constexpr int kRequests = 300;
  const std::string not_utf8("\x0a\x02\xff\xfe", 4);  // MatchRequest.kv_namespace = ff fe
  for (int i = 0; i < kRequests; ++i) {
    grpc::ClientContext context;
    grpc::Slice slice(not_utf8);
    grpc::ByteBuffer response;
    const grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel.get(), grpc::internal::RpcMethod("/kvtier.v1.KvCache/Match", grpc::internal::RpcMethod::NORMAL_RPC),
        &context, grpc::ByteBuffer(&slice, 1), &response);
    ASSERT_FALSE(status.ok());
  }
  // A plaintext client, twice.
  EXPECT_EQ(StatsCode(Client(target, "")), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatsCode(Client(target, "")), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatsCode(Client(target, "trust", kAdmin.token)), absl::StatusCode::kOk);
  // The CLI, plaintext at the TLS port, says what it likely lacks.
  const CommandResult cli = RunCommand(absl::StrCat(KVTIER_BINARY, " stats --target ", target));
  EXPECT_EQ(cli.exit_code, 1) << cli.output;
  EXPECT_NE(cli.output.find("if the server uses TLS, give --tls-dir"), std::string::npos) << cli.output;
  cache.Stop(SIGTERM);
  std::ifstream in(log);
  size_t utf8_lines = 0, plaintext_lines = 0, raw_lines = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("UTF-8") != std::string::npos) ++utf8_lines;
    if (line.find("spoke plaintext to the other's TLS") != std::string::npos) ++plaintext_lines;
    if (!line.starts_with("kvtier-cache: ")) ++raw_lines;
  }
  EXPECT_GE(utf8_lines, 1u);
  EXPECT_LE(utf8_lines, 3u) << kRequests << " bad requests";
  EXPECT_EQ(plaintext_lines, 1u);
  EXPECT_EQ(raw_lines, 0u) << "a line not in kvtier's format";
}

// Tenants cannot reach each other's blocks by any RPC, even knowing the
// hashes; a reader cannot Put; leases are their owner's; Stats shows a
// tenant its own figures, an admin everyone's.
TEST_F(SecurityTest, TenantsCannotReachEachOthersBlocks) {
  const fs::path tenants = Dir("tenants-isolation.json");
  std::ofstream(tenants) << TenantsJson({kAdmin, kAcme, kGlobex, kAuditor});
  const std::string target = StartCache({"--tls-dir", Dir("server").string(), "--tenants", tenants.string()});
  ASSERT_FALSE(target.empty());
  CacheClient acme = Client(target, "trust", kAcme.token);
  CacheClient globex = Client(target, "trust", kGlobex.token);
  CacheClient auditor = Client(target, "trust", kAuditor.token);
  CacheClient admin = Client(target, "trust", kAdmin.token);

  const std::vector<TestBlock> theirs = StoreBlocks(globex, TestLayout(), "globex", 1, 3);
  const std::vector<kvblock::BlockHash> hashes = Hashes(theirs);
  auto matched = globex.Match("globex", TestLayout(), hashes, /*acquire_lease=*/true, 30000);
  ASSERT_TRUE(matched.ok()) << matched.status();
  ASSERT_EQ(matched->matched_blocks(), 3u);

  // acme, knowing globex's hashes and lease.
  EXPECT_EQ(acme.Match("globex", TestLayout(), hashes).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(acme.Get("globex", TestLayout(), hashes).status().code(), absl::StatusCode::kPermissionDenied);
  std::vector<BlockSlices> slices = {MakeBlock(TestLayout(), "globex", 99).slices};
  EXPECT_EQ(acme.Put("globex", TestLayout(), slices).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(acme.ReleaseLease(matched->lease_id()).code(), absl::StatusCode::kNotFound);
  // Stats: its own figures only (it stored nothing yet).
  absl::StatusOr<v1::StatsResponse> own = acme.Stats();
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->tiers(0).used_bytes(), 0u);
  EXPECT_EQ(own->blocks_stored(), 0u) << "a tenant saw the cache's counters";
  // The same hashes in its own namespace are other blocks: none there.
  EXPECT_EQ(acme.Match("acme", TestLayout(), hashes)->matched_blocks(), 0u);
  // A reader of acme's namespace reads it but cannot write it.
  slices = {MakeBlock(TestLayout(), "acme", 5).slices};
  EXPECT_EQ(auditor.Put("acme", TestLayout(), slices).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(acme.Put("acme", TestLayout(), slices).ok());
  EXPECT_EQ(auditor.Match("acme", TestLayout(), {slices[0].hash})->matched_blocks(), 1u);

  // globex's blocks and lease are untouched, and its own release works.
  auto fetched = globex.Get("globex", TestLayout(), hashes);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  ASSERT_EQ(fetched->size(), theirs.size());
  EXPECT_TRUE(globex.ReleaseLease(matched->lease_id()).ok());
  absl::StatusOr<v1::StatsResponse> theirs_stats = globex.Stats(), all = admin.Stats();
  ASSERT_TRUE(theirs_stats.ok() && all.ok());
  EXPECT_EQ(theirs_stats->tiers(0).used_bytes(), 3 * TestBlockCharged())
      << "globex's own three blocks, in whole pages, with their bookkeeping";
  EXPECT_EQ(all->blocks_stored(), 4u) << "the admin sees everyone's";
}

// A tenant writing ten times its quota demotes and drops its own blocks;
// another tenant's, within its quota, stay where they were.
TEST_F(SecurityTest, ATenantWritingTenTimesItsQuotaEvictsOnlyItsOwn) {
  // A TestLayout block takes 5 pages of 64 KiB: 320 KiB.
  const std::string quota = R"({"deviceBytes": 2097152, "hostBytes": 2097152})";  // 6 blocks each
  TestTenant acme = kAcme, globex = kGlobex;
  acme.quota = globex.quota = quota;
  const fs::path tenants = Dir("tenants-quota.json");
  std::ofstream(tenants) << TenantsJson({kAdmin, acme, globex});
  std::string metrics;
  const std::string target = StartCache({"--tenants", tenants.string()}, &metrics);
  ASSERT_FALSE(target.empty());
  ASSERT_FALSE(metrics.empty());
  CacheClient acme_client = Client(target, "", acme.token), globex_client = Client(target, "", globex.token);
  const std::vector<TestBlock> theirs = StoreBlocks(globex_client, TestLayout(), "globex", 1, 5);
  for (int round = 0; round < 12; ++round) StoreBlocks(acme_client, TestLayout(), "acme", 100 + 5 * round, 5);
  auto matched = globex_client.Match("globex", TestLayout(), Hashes(theirs));
  ASSERT_TRUE(matched.ok()) << matched.status();
  EXPECT_EQ(matched->matched_blocks(), 5u);
  for (int t : matched->tiers()) EXPECT_EQ(t, v1::TIER_DEVICE) << "globex's block left the device tier";
  auto stats = Client(target, "", kAdmin.token).Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->tiers(0).evictions() + stats->tiers(1).evictions(), 0u) << "acme never went over its quota";

  // The same, per tenant, on /metrics; and a refusal, counted.
  EXPECT_EQ(acme_client.Match("globex", TestLayout(), {}).status().code(), absl::StatusCode::kPermissionDenied);
  const std::string page = ScrapeMetrics(metrics);
  EXPECT_GT(MetricValue(page, R"(kvtier_cache_tenant_evictions_total{tenant="acme"})").value_or(0), 0) << page;
  EXPECT_FALSE(MetricValue(page, R"(kvtier_cache_tenant_evictions_total{tenant="globex"})").has_value());
  EXPECT_EQ(MetricValue(page, R"(kvtier_cache_tenant_used_bytes{tenant="globex",tier="device"})"),
            5.0 * TestBlockCharged());
  EXPECT_LE(MetricValue(page, R"(kvtier_cache_tenant_used_bytes{tenant="acme",tier="device"})").value_or(1e18),
            2097152.0);
  EXPECT_EQ(MetricValue(page, R"(kvtier_cache_tenant_hits_total{tenant="globex"})"), 5.0);
  EXPECT_EQ(MetricValue(page, R"(kvtier_cache_tenant_denied_total{reason="PERMISSION_DENIED",tenant="acme"})"), 1.0);
}

std::vector<TestBlock> SecurityTest::StoreThenStop(const std::vector<std::string>& flags, const TestTenant& acme,
                                                   int acme_blocks, int globex_blocks) {
  std::vector<TestBlock> stored;
  {
    const std::string target = StartCache(flags);
    if (target.empty()) return {};
    CacheClient acme_client = Client(target, "", acme.token), globex = Client(target, "", kGlobex.token);
    stored = StoreBlocks(acme_client, TestLayout(), "acme", 1, acme_blocks);
    StoreBlocks(globex, TestLayout(), "globex", 1, globex_blocks);
  }
  EXPECT_EQ(caches_.back()->Stop(SIGTERM), 0);
  return stored;
}

// A restart finds each tenant's blocks charged to it again (the disk
// files name it): its Stats and /metrics say what they said before the
// stop, which moved everything to the disk tier.
TEST_F(SecurityTest, ARestartKeepsEachTenantsBlocksChargedToIt) {
  const fs::path tenants = Dir("tenants-restart.json");
  std::ofstream(tenants) << TenantsJson({kAdmin, kAcme, kGlobex});
  const std::vector<std::string> flags = {
      "--tenants",       tenants.string(), "--disk-dir", Dir("restart-disk").string(),
      "--disk-capacity", "64MiB",          "--drain-ms", "0"};
  const std::vector<TestBlock> acmes = StoreThenStop(flags, kAcme, 4, 2);
  ASSERT_EQ(acmes.size(), 4u);

  std::string metrics;
  const std::string target = StartCache(flags, &metrics);
  ASSERT_FALSE(target.empty());
  CacheClient acme = Client(target, "", kAcme.token), globex = Client(target, "", kGlobex.token);
  const uint64_t charged = acmes[0].record.size() + kBookkeepingBytesPerBlock;
  const absl::StatusOr<v1::StatsResponse> acme_stats = acme.Stats(), globex_stats = globex.Stats();
  ASSERT_TRUE(acme_stats.ok() && globex_stats.ok());
  EXPECT_EQ(acme_stats->tiers(2).used_bytes(), 4 * charged);
  EXPECT_EQ(globex_stats->tiers(2).used_bytes(), 2 * charged);
  const std::string page = ScrapeMetrics(metrics);
  EXPECT_EQ(MetricValue(page, R"(kvtier_cache_tenant_used_bytes{tenant="acme",tier="disk"})"), 4.0 * charged) << page;
  auto got = acme.Get("acme", TestLayout(), Hashes(acmes));
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < acmes.size(); ++i) EXPECT_EQ((*got)[i].record, acmes[i].record) << i;
}

// A tenant's quota in the tenants file holds the blocks a restart found
// before the tenant's first Put: another tenant, without a quota, makes
// room out of its own blocks, not out of the older ones within a quota.
TEST_F(SecurityTest, QuotasHoldTheBlocksARestartFoundBeforeTheirTenantsPut) {
  TestTenant acme = kAcme;
  acme.quota = R"({"deviceBytes": 1048576, "hostBytes": 1048576, "diskBytes": 4194304})";
  const fs::path tenants = Dir("tenants-restart-quota.json");
  std::ofstream(tenants) << TenantsJson({kAdmin, acme, kGlobex});
  // Three blocks a memory tier, eight on disk.
  const std::vector<std::string> flags = {"--tenants",       tenants.string(), "--disk-dir",        Dir("quota-disk"),
                                          "--disk-capacity", "2400KiB",        "--device-capacity", "1MiB",
                                          "--host-capacity", "1MiB",           "--drain-ms",        "0"};
  const std::vector<TestBlock> acmes = StoreThenStop(flags, acme, 4, 4);
  ASSERT_EQ(acmes.size(), 4u);

  std::string metrics;
  const std::string target = StartCache(flags, &metrics);
  ASSERT_FALSE(target.empty());
  CacheClient globex = Client(target, "", kGlobex.token);
  StoreBlocks(globex, TestLayout(), "globex", 100, 8);
  auto matched = Client(target, "", acme.token).Match("acme", TestLayout(), Hashes(acmes));
  ASSERT_TRUE(matched.ok()) << matched.status();
  EXPECT_EQ(matched->matched_blocks(), 4u) << "acme's blocks made room for globex's";
  const std::string page = ScrapeMetrics(metrics);
  EXPECT_GT(MetricValue(page, R"(kvtier_cache_tenant_evictions_total{tenant="globex"})").value_or(0), 0) << page;
  EXPECT_FALSE(MetricValue(page, R"(kvtier_cache_tenant_evictions_total{tenant="acme"})").has_value()) << page;
}

// A quota lowered in the tenants file holds once the cache reads the file
// again, before its tenant's next Put: acme's older blocks, over its new
// quota, make room for globex's (before, globex's own went: acme was
// within the quota its Puts had brought).
TEST_F(SecurityTest, AQuotaLoweredInTheTenantsFileHoldsAtTheReload) {
  TestTenant acme = kAcme, globex = kGlobex;
  acme.quota = globex.quota = R"({"deviceBytes": 2097152, "hostBytes": 2097152, "diskBytes": 4194304})";
  const fs::path tenants = Dir("tenants-lowered.json");
  std::ofstream(tenants) << TenantsJson({kAdmin, acme, globex});
  std::string metrics;
  // Three blocks a memory tier, eight on disk.
  const std::string target =
      StartCache({"--tenants", tenants.string(), "--device-capacity", "1MiB", "--host-capacity", "1MiB", "--disk-dir",
                  Dir("lowered-disk"), "--disk-capacity", "2400KiB", "--no-demote-ahead"},
                 &metrics);
  ASSERT_FALSE(target.empty());
  CacheClient acme_client = Client(target, "", acme.token), globex_client = Client(target, "", globex.token);
  StoreBlocks(acme_client, TestLayout(), "acme", 1, 6);        // the oldest, all on disk
  StoreBlocks(globex_client, TestLayout(), "globex", 100, 7);  // some on disk too
  ASSERT_EQ(ScrapeMetrics(metrics).find("kvtier_cache_tenant_evictions_total{"), std::string::npos);

  // The quota the cache holds acme's blocks to, by /metrics.
  const auto acme_disk_quota = [&] {
    const std::string page = ScrapeMetrics(metrics);
    return MetricValue(page, R"(kvtier_cache_tenant_quota_bytes{tenant="acme",tier="disk"})").value_or(0);
  };
  EXPECT_EQ(acme_disk_quota(), 4194304);
  constexpr uint64_t kLowered = 921600;  // three blocks on disk
  acme.quota = absl::StrCat(R"({"deviceBytes": 2097152, "hostBytes": 2097152, "diskBytes": )", kLowered, "}");
  WriteAtomically(tenants, TenantsJson({kAdmin, acme, globex}));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (acme_disk_quota() != kLowered && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_EQ(acme_disk_quota(), kLowered) << "the cache did not take the tenants file's new quota";

  StoreBlocks(globex_client, TestLayout(), "globex", 200, 3);
  const std::string page = ScrapeMetrics(metrics);
  EXPECT_GT(MetricValue(page, R"(kvtier_cache_tenant_evictions_total{tenant="acme"})").value_or(0), 0) << page;
  EXPECT_FALSE(MetricValue(page, R"(kvtier_cache_tenant_evictions_total{tenant="globex"})").has_value())
      << "globex's blocks made room, not acme's over its quota\n"
      << page;
}

// Streams outlive reloads of the tenants file, not their callers' rights:
// once the file takes them away (the tenant gone, or made a reader), a Put
// stream's next message ends it with the status a new call would get, and
// the block it had begun is dropped; a Get read slowly ends before its next
// block. The streams of a tenant that keeps its rights go on.
TEST_F(SecurityTest, StreamsEndWhenTheTenantsFileTakesTheirRightsAway) {
  const TestTenant initech{"initech", "WRITER", "initech", "initech-token-5e21"};
  const fs::path tenants = Dir("tenants-revoked.json");
  WriteAtomically(tenants, TenantsJson({kAdmin, kAcme, kGlobex, initech, kAuditor}));
  const std::string target = StartCache({"--tenants", tenants.string()});
  ASSERT_FALSE(target.empty());
  CacheClient admin = Client(target, "", kAdmin.token);
  const kvblock::LatentLayout layout = TestLayout();
  struct Stream {
    const TestTenant* tenant;
    std::vector<TestBlock> blocks;  // the first whole before the reload, the second begun
    grpc::ClientContext context;
    v1::PutResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::PutRequest>> writer;
  };
  std::vector<std::unique_ptr<CacheClient>> clients;
  std::vector<std::unique_ptr<Stream>> streams;
  const auto write_layers = [](Stream& s, const TestBlock& b, uint32_t begin, uint32_t end) {
    for (uint32_t l = begin; l < end; ++l) {
      if (!s.writer->Write(SliceMessage(b, l))) return;  // ended by the cache: Finish says why
    }
  };
  for (const TestTenant* t : {&kAcme, &kGlobex, &initech}) {
    clients.push_back(std::make_unique<CacheClient>(Client(target, "", t->token)));
    auto s = std::make_unique<Stream>();
    s->tenant = t;
    s->blocks = {MakeBlock(layout, t->ns, 1), MakeBlock(layout, t->ns, 2)};
    s->writer = clients.back()->stub().Put(&s->context, &s->response);
    ASSERT_TRUE(s->writer->Write(HeaderMessage(t->ns, layout)));
    write_layers(*s, s->blocks[0], 0, layout.num_layers);
    write_layers(*s, s->blocks[1], 0, 3);
    streams.push_back(std::move(s));
  }
  ASSERT_TRUE(StatsEventually(admin, [](const v1::StatsResponse& s) { return s.pending_blocks() == 3; }));
  // Gets of a first block many times over (more than flow control lets
  // the cache send ahead), one answer read of each: acme's and globex's of
  // their own, the auditor's (a reader of acme's namespace) of acme's.
  constexpr int kCopies = 256;
  struct Read {
    std::unique_ptr<CacheClient> client;
    const TestBlock* block;
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::GetResponse>> reader;
    int answers = 0;
  };
  std::vector<std::unique_ptr<Read>> reads;
  for (const auto& [reader, of] : {std::pair{&kAcme, 0}, {&kGlobex, 1}, {&kAuditor, 0}}) {
    auto read = std::make_unique<Read>();
    read->client = std::make_unique<CacheClient>(Client(target, "", reader->token));
    read->block = &streams[of]->blocks[0];
    v1::GetRequest request;
    request.set_kv_namespace(streams[of]->tenant->ns);
    *request.mutable_layout() = kvblock::LayoutToProto(layout);
    for (int c = 0; c < kCopies; ++c)
      request.add_block_hashes(std::string(kvblock::HashAsBytes(read->block->slices.hash)));
    read->reader = read->client->stub().Get(&read->context, request);
    v1::GetResponse answer;
    ASSERT_TRUE(read->reader->Read(&answer)) << reader->name;
    ASSERT_EQ(answer.data(), read->block->record) << reader->name;
    ++read->answers;
    reads.push_back(std::move(read));
  }

  TestTenant globex_reader = kGlobex, auditor_moved = kAuditor;
  globex_reader.role = "READER";
  auditor_moved.ns = "globex";
  WriteAtomically(tenants, TenantsJson({kAdmin, globex_reader, initech, auditor_moved}));
  ASSERT_TRUE(testing::Eventually([&] {
    return clients[0]->Stats().status().code() == absl::StatusCode::kUnauthenticated;
  })) << "the cache did not take the new tenants file";
  const std::vector<grpc::StatusCode> expected = {grpc::StatusCode::UNAUTHENTICATED,
                                                  grpc::StatusCode::PERMISSION_DENIED, grpc::StatusCode::OK};
  for (size_t i = 0; i < streams.size(); ++i) {
    Stream& s = *streams[i];
    SCOPED_TRACE(s.tenant->name);
    write_layers(s, s.blocks[1], 3, layout.num_layers);
    s.writer->WritesDone();
    const grpc::Status status = s.writer->Finish();
    EXPECT_EQ(status.error_code(), expected[i]) << status.error_message();
    const uint32_t stored = status.ok() ? 2 : 1;
    EXPECT_EQ(admin.Match(s.tenant->ns, layout, Hashes(s.blocks))->matched_blocks(), stored);
  }
  EXPECT_TRUE(StatsEventually(admin, [](const v1::StatsResponse& s) { return s.pending_blocks() == 0; }))
      << "an ended stream's begun block was kept";
  // acme is gone; globex, a reader now, may read its namespace still; the
  // auditor may read globex's now, not acme's.
  const std::vector<grpc::StatusCode> read_expected = {grpc::StatusCode::UNAUTHENTICATED, grpc::StatusCode::OK,
                                                       grpc::StatusCode::PERMISSION_DENIED};
  for (size_t i = 0; i < reads.size(); ++i) {
    Read& read = *reads[i];
    SCOPED_TRACE(absl::StrCat("Get ", i));
    for (v1::GetResponse answer; read.reader->Read(&answer);) ++read.answers;
    const grpc::Status status = read.reader->Finish();
    EXPECT_EQ(status.error_code(), read_expected[i]) << status.error_message();
    if (status.ok()) {
      EXPECT_EQ(read.answers, kCopies);
    } else {
      EXPECT_LT(read.answers, kCopies);
    }
  }
}

// Quotas that add up to more than a tier holds are warned of, tier by
// tier (a tenant within its quota may then lose blocks to another's
// Puts); the cache serves on. Quotas that fit are not.
TEST_F(SecurityTest, QuotasAddingUpToMoreThanATierHoldsAreWarnedOf) {
  TestTenant acme = kAcme, globex = kGlobex;
  acme.quota = globex.quota = R"({"deviceBytes": 10485760, "hostBytes": 4194304})";
  const fs::path tenants = Dir("tenants-overcommitted.json");
  std::ofstream(tenants) << TenantsJson({kAdmin, acme, globex});
  const CommandResult r = RunCommand(absl::StrCat("timeout -s TERM 3 ", KVTIER_CACHE_BINARY,
                                                  " --listen 127.0.0.1:0 --metrics-listen '' --device-capacity 16MiB"
                                                  " --host-capacity 16MiB --drain-ms 0 --tenants ",
                                                  tenants.string()));
  EXPECT_NE(r.output.find("listening on"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the tenants' quotas in the device tier add up to 20971520 bytes, more than the "
                          "16777216 it holds"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("quotas in the host tier"), std::string::npos) << r.output;
}

// A tenant that spreads tiny blocks over many namespaces takes no more
// shared memory than one namespace would: namespaces the same tenants may
// read share segments, so its 48 one-block namespaces evict none of
// another tenant's blocks (each in a segment of its own, they did: 48
// segments of 4 MiB in a 16 + 16 MiB cache).
TEST_F(SecurityTest, ManyTinyNamespacesOfOneTenantEvictNoOneElse) {
  std::string namespaces;
  for (int i = 0; i < 48; ++i) absl::StrAppend(&namespaces, i ? "," : "", "spread-", i);
  TestTenant spreader{"spreader", "WRITER", namespaces, "spreader-token-5e1d"};
  spreader.quota = R"({"deviceBytes": 1048576, "hostBytes": 1048576})";
  const fs::path tenants = Dir("tenants-spread.json");
  std::ofstream(tenants) << TenantsJson({kAdmin, kGlobex, spreader});
  const std::string target = StartCache({"--tenants", tenants.string()});
  ASSERT_FALSE(target.empty());
  CacheClient globex = Client(target, "", kGlobex.token), spread = Client(target, "", spreader.token);
  const std::vector<TestBlock> theirs = StoreBlocks(globex, TestLayout(), "globex", 1, 24);
  const kvblock::LatentLayout tiny = {.model_id = "tiny",
                                      .num_layers = 2,
                                      .kv_lora_rank = 8,
                                      .rope_dim = 0,
                                      .tokens_per_block = 4,
                                      .codec = kernels::Codec::kInt8};
  std::vector<std::vector<TestBlock>> spread_blocks;
  for (int i = 0; i < 48; ++i)
    spread_blocks.push_back(StoreBlocks(spread, tiny, absl::StrCat("spread-", i), 1000 + i, 1));
  auto matched = globex.Match("globex", TestLayout(), Hashes(theirs));
  ASSERT_TRUE(matched.ok()) << matched.status();
  EXPECT_EQ(matched->matched_blocks(), theirs.size()) << "the spreader's namespaces evicted globex's blocks";
  for (int i = 0; i < 48; ++i) {
    auto own = spread.Match(absl::StrCat("spread-", i), tiny, Hashes(spread_blocks[i]));
    ASSERT_TRUE(own.ok()) << own.status();
    EXPECT_EQ(own->matched_blocks(), 1u) << "spread-" << i;
  }
}

// A service (a prefill node) acting for its end tenants: what it stores
// for each is charged to that tenant and held to its quota, so one writing
// ten times its quota through the service evicts only its own blocks; a
// READER's call stores nothing; and only a service may act, only for an
// end tenant, only in namespaces both may use.
TEST_F(SecurityTest, AServiceActsForItsEndTenantsWithinTheirQuotasAndRoles) {
  const std::string quota = R"({"deviceBytes": 2097152, "hostBytes": 2097152})";  // 6 blocks each
  TestTenant acme = kAcme, globex = kGlobex;
  acme.quota = globex.quota = quota;
  const TestTenant service{"kvtier-services", "SERVICE", "acme,globex", "services-token-5e21"};
  const TestTenant initech{"initech", "WRITER", "initech", "initech-token-a9d3"};
  const fs::path tenants = Dir("tenants-acting.json");
  std::ofstream(tenants) << TenantsJson({kAdmin, acme, globex, kAuditor, service, initech});
  std::string metrics;
  const std::string target = StartCache({"--tenants", tenants.string()}, &metrics);
  ASSERT_FALSE(target.empty());
  ASSERT_FALSE(metrics.empty());
  const auto acting_for = [&](const std::string& tenant) {
    CacheClient client = Client(target, "", service.token);
    client.ActFor(tenant);
    return client;
  };
  CacheClient for_acme = acting_for("acme"), for_globex = acting_for("globex");
  const std::vector<TestBlock> theirs = StoreBlocks(for_globex, TestLayout(), "globex", 1, 5);
  for (int round = 0; round < 12; ++round) StoreBlocks(for_acme, TestLayout(), "acme", 100 + 5 * round, 5);
  auto matched = for_globex.Match("globex", TestLayout(), Hashes(theirs));
  ASSERT_TRUE(matched.ok()) << matched.status();
  EXPECT_EQ(matched->matched_blocks(), 5u);
  for (int t : matched->tiers()) EXPECT_EQ(t, v1::TIER_DEVICE) << "globex's block left the device tier";
  const std::string page = ScrapeMetrics(metrics);
  EXPECT_EQ(MetricValue(page, R"(kvtier_cache_tenant_used_bytes{tenant="globex",tier="device"})"),
            5.0 * TestBlockCharged())
      << page;
  EXPECT_LE(MetricValue(page, R"(kvtier_cache_tenant_used_bytes{tenant="acme",tier="device"})").value_or(1e18),
            2097152.0);
  EXPECT_GT(MetricValue(page, R"(kvtier_cache_tenant_evictions_total{tenant="acme"})").value_or(0), 0) << page;
  EXPECT_FALSE(
      MetricValue(page, R"(kvtier_cache_tenant_used_bytes{tenant="kvtier-services",tier="device"})").value_or(0) > 0)
      << "the service was charged: " << page;

  // A READER's generation reads and stores nothing.
  CacheClient for_auditor = acting_for("auditor");
  EXPECT_TRUE(for_auditor.Match("acme", TestLayout(), {}).ok());
  const TestBlock block = MakeBlock(TestLayout(), "acme", 999);
  EXPECT_EQ(for_auditor.Put("acme", TestLayout(), {block.slices}).status().code(), absl::StatusCode::kPermissionDenied);
  // Acting needs a service, an end tenant the file lists, and a namespace
  // both may use.
  struct Attempt {
    std::string token, acting_for, ns;
  };
  const std::vector<Attempt> refused = {
      {acme.token, "globex", "globex"},       // not a service
      {kAuditor.token, "acme", "acme"},       // not a service, though both use acme (a reader as a writer)
      {service.token, "ops", "acme"},         // an admin
      {service.token, "nobody", "acme"},      // not in the file
      {service.token, "initech", "initech"},  // not the service's
      {service.token, "acme", "globex"},      // not acme's
  };
  for (const Attempt& a : refused) {
    CacheClient client = Client(target, "", a.token);
    client.ActFor(a.acting_for);
    EXPECT_EQ(client.Match(a.ns, TestLayout(), {}).status().code(), absl::StatusCode::kPermissionDenied)
        << a.acting_for << " in " << a.ns;
  }
  EXPECT_TRUE(for_acme.Match("acme", TestLayout(), {}).ok());
}

}  // namespace
}  // namespace kvtier::cache
