// The same-host fast path against the real kvtier-cache binary: identical
// bytes through both paths, the socket protocol's refusals, lease expiry, a
// client killed holding leases, a cache restart under a client's mappings,
// and the fallback to TCP. Over 600 lines: one fixture (a running cache and
// raw socket sessions) for every case.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/base/child_process.h"
#include "services/cache/client/shard_set.h"
#include "services/cache/fast_path/fast_path_client.h"
#include "services/cache/fast_path/fast_path_socket.h"
#include "services/rpc/client_identity.h"
#include "tests/eventually.h"
#include "tests/integration/cache_test_blocks.h"
#include "tests/integration/test_tenants.h"
#include "tests/temp_dir.h"
#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

using kvblock::BlockHash;

const std::string& Bytes(const std::string& record) { return record; }
const std::string& Bytes(const cache::SharedRecord& record) { return *record; }

// Every record of `expected` arrived, byte for byte (`Record`: as the fast
// path client or the shard set gives it).
template <typename Record>
::testing::AssertionResult SameRecords(const std::vector<absl::StatusOr<Record>>& got,
                                       const std::vector<TestBlock>& expected) {
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!got[i].ok()) return ::testing::AssertionFailure() << "block " << i << ": " << got[i].status();
    if (Bytes(*got[i]) != expected[i].record) return ::testing::AssertionFailure() << "block " << i << " differs";
  }
  return ::testing::AssertionSuccess();
}

class FastPathTest : public ::testing::Test {
 protected:
  // `port` 0: any free port.
  void StartCache(std::vector<std::string> extra = {}, int port = 0) {
    std::vector<std::string> argv = {KVTIER_CACHE_BINARY,
                                     "--listen",
                                     "127.0.0.1:" + std::to_string(port),
                                     "--metrics-listen",
                                     "",
                                     "--device-capacity",
                                     "32MiB",
                                     "--host-capacity",
                                     "64MiB",
                                     "--threads",
                                     "2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    cache_ = std::make_unique<ChildProcess>(std::move(argv));
    port_ = cache_->WaitForListeningPort();
    ASSERT_GT(port_, 0);
    target_ = "127.0.0.1:" + std::to_string(port_);
    // Its own connection: after a restart on the same port, a shared one
    // could still be in reconnect backoff.
    channel_ = MakeChannel(target_, Connection::kOwn);
    client_ = std::make_unique<CacheClient>(channel_);
  }
  void SetUp() override { StartCache(); }

  // Restarts the cache with `tenants` and an admin in a tenants file it
  // checks every second (SwapTenants changes it); this fixture's client is
  // then the admin, who may read every namespace.
  void StartCacheWithTenants(const std::vector<testing::TestTenant>& tenants) {
    tenants_dir_ = std::make_unique<testing::TempDir>("kvtier_fast_path_tenants_");
    SwapTenants(tenants);
    StartCache({"--tenants", (*tenants_dir_ / "tenants.json").string(), "--reload-seconds", "1"});
    channel_ = *MakeChannelAs({.tls = {}, .token_file = testing::WriteTokenFile(tenants_dir_->path(), kAdmin.token)},
                              target_, Connection::kOwn);
    client_ = std::make_unique<CacheClient>(channel_);
  }
  // Tenants "tenant-a" and "tenant-b", each alone in its namespace of that
  // name, so their blocks never share a segment.
  void StartCacheWithTwoTenants() { StartCacheWithTenants({kTenantA, kTenantB}); }
  // Replaces the tenants file by a rename: `tenants` and the admin.
  void SwapTenants(std::vector<testing::TestTenant> tenants) {
    tenants.push_back(kAdmin);
    testing::WriteAtomically(*tenants_dir_ / "tenants.json", testing::TenantsJson(tenants));
  }
  // A client of the cache calling as tenant `t` (StartCacheWithTenants's).
  std::unique_ptr<CacheClient> ClientOf(const testing::TestTenant& t) {
    return std::make_unique<CacheClient>(
        *MakeChannelAs({.tls = {}, .token_file = testing::WriteTokenFile(tenants_dir_->path(), t.token)}, target_));
  }

  // Stores blocks made from seeds first..first+count-1 in `ns`.
  std::vector<TestBlock> PutBlocks(const std::string& ns, uint64_t first, int count) {
    return StoreBlocks(*client_, layout_, ns, first, count);
  }

  v1::StatsResponse Stats() {
    auto s = client_->Stats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : v1::StatsResponse();
  }

  // Asks Stats until `done` holds (the cache acts on its own clock and
  // socket events); false after 10 s.
  bool StatsBecome(const std::function<bool(const v1::StatsResponse&)>& done) {
    return testing::Eventually([&] { return done(Stats()); });
  }

  // A raw session: opened, and (when `prove`) proven over its socket.
  struct RawSession {
    v1::OpenFastPathResponse opened;
    int socket = -1;
    ~RawSession() {
      if (socket >= 0) close(socket);
    }
  };
  // `as`: another client than the fixture's; `staging_bytes` asked for.
  std::unique_ptr<RawSession> OpenRaw(bool prove = true, CacheClient* as = nullptr, uint64_t staging_bytes = 0) {
    auto s = std::make_unique<RawSession>();
    grpc::ClientContext context;
    v1::OpenFastPathRequest request;
    request.set_staging_bytes(staging_bytes);
    EXPECT_TRUE((as != nullptr ? as : client_.get())->stub().OpenFastPath(&context, request, &s->opened).ok());
    if (!prove) return s;
    s->socket = *fastpath::Connect(s->opened.socket_path());
    int fd;
    EXPECT_TRUE(fastpath::SendRequest(s->socket, Hello(s->opened)).ok());
    EXPECT_TRUE(fastpath::ReceiveReply(s->socket, fd).ok());
    return s;
  }
  static fastpath::Request Hello(const v1::OpenFastPathResponse& opened) {
    fastpath::Request hello{fastpath::RequestKind::kHello};
    hello.session_id = opened.session_id();
    std::memcpy(hello.secret.data(), opened.secret().data(), hello.secret.size());
    return hello;
  }
  grpc::Status Lease(const RawSession& s, const std::string& ns, const std::vector<BlockHash>& hashes,
                     v1::LeaseBlocksResponse& response, uint32_t ttl_ms = 0, CacheClient* as = nullptr) {
    v1::LeaseBlocksRequest request;
    request.set_session_id(s.opened.session_id());
    request.set_kv_namespace(ns);
    *request.mutable_layout() = kvblock::LayoutToProto(layout_);
    for (const BlockHash& h : hashes) request.add_block_hashes(std::string(kvblock::HashAsBytes(h)));
    request.set_lease_ttl_ms(ttl_ms);
    grpc::ClientContext context;
    return (as != nullptr ? as : client_.get())->stub().LeaseBlocks(&context, request, &response);
  }
  // Asks for a segment's descriptor: the reply's status, `fd` if any.
  absl::Status AskSegment(const RawSession& s, const v1::SharedPiece& piece, int& fd, uint64_t generation_delta = 0) {
    fastpath::Request request{fastpath::RequestKind::kSegment};
    request.tier = piece.tier_index();
    request.segment = piece.segment();
    request.generation = piece.generation() + generation_delta;
    EXPECT_TRUE(fastpath::SendRequest(s.socket, request).ok());
    return fastpath::ReceiveReply(s.socket, fd);
  }

  // Reads `hashes` through `client` into strings; misses keep their status.
  std::vector<absl::StatusOr<std::string>> FetchAll(FastPathClient& fast, const std::string& ns,
                                                    const std::vector<BlockHash>& hashes,
                                                    std::vector<uint32_t>* fallback = nullptr) {
    std::vector<std::string> records(hashes.size());
    std::vector<absl::StatusOr<std::string>> out(hashes.size(), absl::UnknownError("not delivered"));
    auto left = fast.Fetch(
        ns, layout_, hashes,
        [&](uint32_t i, size_t size) {
          records[i].resize(size);
          return std::span(reinterpret_cast<uint8_t*>(records[i].data()), size);
        },
        [&](const RawBlock& b) {
          out[b.index] = b.status.ok() ? absl::StatusOr<std::string>(records[b.index]) : b.status;
        });
    EXPECT_TRUE(left.ok()) << left.status();
    if (fallback != nullptr && left.ok()) *fallback = *left;
    return out;
  }

  kvblock::LatentLayout layout_ = TestLayout();
  std::unique_ptr<ChildProcess> cache_;
  int port_ = 0;
  std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<CacheClient> client_;
  const testing::TestTenant kTenantA{"tenant-a", "WRITER", "tenant-a", "a-token"};
  const testing::TestTenant kTenantB{"tenant-b", "WRITER", "tenant-b", "b-token"};
  const testing::TestTenant kAdmin{"ops", "ADMIN", "", "admin-token"};
  std::unique_ptr<testing::TempDir> tenants_dir_;  // StartCacheWithTenants's
  testing::SeededRng rng_;
};

TEST_F(FastPathTest, SameRandomBlocksReadBackIdenticalThroughBothPaths) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<TestBlock> blocks = PutBlocks("tenant-a", rng_.seed(), 24);
  std::vector<BlockHash> hashes = Hashes(blocks);
  hashes.push_back(MakeBlock(layout_, "tenant-a", rng_.seed() + 1000).slices.hash);  // never stored

  auto fast = FastPathClient::Connect(channel_, absl::Seconds(10));
  ASSERT_TRUE(fast.ok()) << fast.status();
  std::vector<uint32_t> fallback;
  const auto through_shm = FetchAll(**fast, "tenant-a", hashes, &fallback);
  EXPECT_TRUE(fallback.empty());
  auto through_tcp = client_->Get("tenant-a", layout_, hashes);
  ASSERT_TRUE(through_tcp.ok()) << through_tcp.status();
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(through_shm[i].ok()) << i << ": " << through_shm[i].status();
    EXPECT_EQ(*through_shm[i], blocks[i].record) << "block " << i;
    EXPECT_EQ(*through_shm[i], (*through_tcp)[i].record) << "block " << i;
  }
  EXPECT_EQ(through_shm.back().status().code(), absl::StatusCode::kNotFound);
  EXPECT_GT((*fast)->mapped_segments(), 0u);

  const v1::StatsResponse stats = Stats();
  EXPECT_EQ(stats.fast_path_sessions(), 1u);
  EXPECT_EQ(stats.fast_path_blocks_out(), blocks.size());
  EXPECT_EQ(stats.fast_path_bytes_out(), blocks.size() * blocks[0].record.size());
  // `kvtier stats` says the same.
  const CommandResult json = RunCommand(std::string(KVTIER_BINARY) + " stats --json --target " + target_);
  EXPECT_NE(json.output.find("\"fast_path_sessions\": 1, \"fast_path_blocks_out\": 24, \"fast_path_bytes_out\": " +
                             std::to_string(stats.fast_path_bytes_out())),
            std::string::npos)
      << json.output;
  const CommandResult table = RunCommand(std::string(KVTIER_BINARY) + " stats --target " + target_);
  EXPECT_NE(table.output.find("same-host fast path: 1 sessions, 24 blocks"), std::string::npos) << table.output;
  // Fetch ends its lease over the socket without waiting for the cache.
  EXPECT_TRUE(StatsBecome([](const v1::StatsResponse& s) { return s.pinned_blocks() == 0; }));
}

// With a tenants file, a session is its tenant's: tenant A's session
// cannot lease tenant B's blocks, even knowing their hashes, and B cannot
// use A's session at all; each reads its own through shared memory.
TEST_F(FastPathTest, ASessionServesOnlyItsOwnTenant) {
  const testing::TempDir dir("kvtier_fast_path_tenants_");
  const std::string seed = std::to_string(rng_.seed());
  const testing::TestTenant tenant_a{"tenant-a", "WRITER", "tenant-a", "a-token-" + seed};
  const testing::TestTenant tenant_b{"tenant-b", "WRITER", "tenant-b", "b-token-" + seed};
  std::ofstream(dir / "tenants.json") << testing::TenantsJson({tenant_a, tenant_b});
  StartCache({"--tenants", (dir / "tenants.json").string()});
  const auto channel_of = [&](const testing::TestTenant& t) {
    return *MakeChannelAs({.tls = {}, .token_file = testing::WriteTokenFile(dir.path(), t.token)}, target_);
  };
  auto channel_a = channel_of(tenant_a), channel_b = channel_of(tenant_b);
  CacheClient a(channel_a), b(channel_b);
  const std::vector<TestBlock> mine = StoreBlocks(a, layout_, "tenant-a", rng_.seed(), 3);
  const std::vector<TestBlock> theirs = StoreBlocks(b, layout_, "tenant-b", rng_.seed() + 50, 3);

  auto fast_a = FastPathClient::Connect(channel_a, absl::Seconds(10));
  ASSERT_TRUE(fast_a.ok()) << fast_a.status();
  EXPECT_TRUE(SameRecords(FetchAll(**fast_a, "tenant-a", Hashes(mine)), mine));
  const auto refused = (*fast_a)->Fetch(
      "tenant-b", layout_, Hashes(theirs), [](uint32_t, size_t) { return std::span<uint8_t>(); },
      [](const RawBlock&) {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  // B, knowing A's session id, cannot lease through it.
  v1::LeaseBlocksRequest request;
  request.set_session_id((*fast_a)->session_id());
  request.set_kv_namespace("tenant-b");
  *request.mutable_layout() = kvblock::LayoutToProto(layout_);
  for (const BlockHash& h : Hashes(theirs)) request.add_block_hashes(std::string(kvblock::HashAsBytes(h)));
  grpc::ClientContext context;
  b.SetDeadline(context);
  v1::LeaseBlocksResponse response;
  EXPECT_EQ(b.stub().LeaseBlocks(&context, request, &response).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(response.blocks_size(), 0);
}

// A tenant taken out of the tenants file keeps no fast path session: at
// the reload its sessions' connections close, their leases end (their
// blocks no longer pinned) and their staging regions go back to the
// budget; another tenant's session serves on.
TEST_F(FastPathTest, ATenantTakenOutOfTheFileLosesItsSessionsAtTheReload) {
  StartCacheWithTwoTenants();
  std::unique_ptr<CacheClient> as_a = ClientOf(kTenantA), as_b = ClientOf(kTenantB);
  const std::vector<TestBlock> blocks_a = StoreBlocks(*as_a, layout_, "tenant-a", rng_.seed(), 2);
  const std::vector<TestBlock> blocks_b = StoreBlocks(*as_b, layout_, "tenant-b", rng_.seed() + 50, 2);
  constexpr uint64_t kStaging = 1 << 20;
  auto session_a = OpenRaw(/*prove=*/true, as_a.get(), kStaging), session_b = OpenRaw(true, as_b.get(), kStaging);
  v1::LeaseBlocksResponse leased_a, leased_b;
  constexpr uint32_t kMinute = 60000;
  ASSERT_TRUE(Lease(*session_a, "tenant-a", Hashes(blocks_a), leased_a, kMinute, as_a.get()).ok());
  ASSERT_TRUE(Lease(*session_b, "tenant-b", Hashes(blocks_b), leased_b, kMinute, as_b.get()).ok());
  const v1::StatsResponse before = Stats();
  ASSERT_EQ(before.fast_path_sessions(), 2u);
  ASSERT_EQ(before.fast_path_staging_bytes(), 2 * kStaging);
  ASSERT_EQ(before.pinned_blocks(), 4u);

  SwapTenants({kTenantA});
  ASSERT_TRUE(StatsBecome([](const v1::StatsResponse& s) { return s.fast_path_sessions() == 1; }))
      << "tenant-b's session outlived the reload";
  const v1::StatsResponse after = Stats();
  EXPECT_EQ(after.fast_path_staging_bytes(), kStaging) << "tenant-b's staging region was kept";
  EXPECT_EQ(after.pinned_blocks(), 2u) << "tenant-b's lease still pins its blocks";
  char byte;
  EXPECT_EQ(recv(session_b->socket, &byte, 1, MSG_DONTWAIT), 0) << "tenant-b's connection is still open";
  v1::LeaseBlocksResponse again;
  EXPECT_TRUE(Lease(*session_a, "tenant-a", Hashes(blocks_a), again, 0, as_a.get()).ok());
}

// A reader's session holds no staging (its Puts are refused), and a
// tenant turned reader at a reload gives its sessions' staging back: they
// end, and the next it opens gets none.
TEST_F(FastPathTest, ATenantTurnedReaderGivesItsStagingBackAtTheReload) {
  testing::TestTenant a = kTenantA;
  const testing::TestTenant reader{"tenant-r", "READER", "tenant-a", "r-token"};
  StartCacheWithTenants({a, kTenantB, reader});
  std::unique_ptr<CacheClient> as_a = ClientOf(a), as_b = ClientOf(kTenantB), as_reader = ClientOf(reader);
  constexpr uint64_t kStaging = 1 << 20;
  auto session_a = OpenRaw(/*prove=*/true, as_a.get(), kStaging), session_b = OpenRaw(true, as_b.get(), kStaging);
  auto session_r = OpenRaw(true, as_reader.get(), kStaging);
  EXPECT_EQ(session_r->opened.staging_bytes(), 0u);
  ASSERT_TRUE(StatsBecome([](const v1::StatsResponse& s) { return s.fast_path_sessions() == 3; }));
  ASSERT_EQ(Stats().fast_path_staging_bytes(), 2 * kStaging);

  a.role = "READER";
  SwapTenants({a, kTenantB, reader});
  ASSERT_TRUE(StatsBecome([](const v1::StatsResponse& s) { return s.fast_path_sessions() == 2; }))
      << "tenant-a's session outlived the reload, or the reader's did not";
  EXPECT_EQ(Stats().fast_path_staging_bytes(), kStaging) << "tenant-a's staging region was kept";
  char byte;
  EXPECT_EQ(recv(session_a->socket, &byte, 1, MSG_DONTWAIT), 0) << "tenant-a's connection is still open";
  EXPECT_EQ(OpenRaw(true, as_a.get(), kStaging)->opened.staging_bytes(), 0u);
}

// A tenant taken off a namespace at a reload maps none of the segments
// that namespace's blocks go to afterwards, though its session read that
// namespace before (it must lease again, under the new file).
TEST_F(FastPathTest, ATenantTakenOffANamespaceMapsNoneOfItsNewSegments) {
  testing::TestTenant a{"tenant-a", "WRITER", "tenant-a,shared", "a-token"};
  const testing::TestTenant b{"tenant-b", "WRITER", "shared", "b-token"};
  StartCacheWithTenants({a, b});
  std::unique_ptr<CacheClient> as_a = ClientOf(a), as_b = ClientOf(b);
  const std::vector<TestBlock> before = StoreBlocks(*as_b, layout_, "shared", rng_.seed(), 2);
  auto session_a = OpenRaw(/*prove=*/true, as_a.get());
  v1::LeaseBlocksResponse leased;
  ASSERT_TRUE(Lease(*session_a, "shared", Hashes(before), leased, 0, as_a.get()).ok());

  a.ns = "tenant-a";
  SwapTenants({a, b});
  ASSERT_TRUE(testing::Eventually([&] {
    v1::LeaseBlocksResponse refused;
    return Lease(*session_a, "shared", Hashes(before), refused, 0, as_a.get()).error_code() ==
           grpc::StatusCode::PERMISSION_DENIED;
  })) << "the reload did not take tenant-a off the namespace";
  const std::vector<TestBlock> after = StoreBlocks(*as_b, layout_, "shared", rng_.seed() + 50, 2);
  auto session_b = OpenRaw(/*prove=*/true, as_b.get());
  v1::LeaseBlocksResponse leased_b;
  ASSERT_TRUE(Lease(*session_b, "shared", Hashes(after), leased_b, 0, as_b.get()).ok());
  ASSERT_TRUE(leased_b.blocks(0).has_shared());
  int fd = -1;
  EXPECT_TRUE(AskSegment(*session_b, leased_b.blocks(0).shared().pieces(0), fd).ok());
  close(fd);
  for (const v1::LeasedBlock& block : leased_b.blocks()) {
    for (const v1::SharedPiece& piece : block.shared().pieces()) {
      fd = -1;
      EXPECT_EQ(AskSegment(*session_a, piece, fd).code(), absl::StatusCode::kPermissionDenied)
          << "segment " << piece.segment() << " of tier " << piece.tier_index();
      if (fd >= 0) close(fd);
    }
  }
}

// Four tenants storing and reading at once through tiers a few times
// smaller than what they store: segments change tenant all the time, those
// of the two tenants that also read through shared memory opened by their
// readers (a new memfd each time), the others not (cleared in place).
// Every record a tenant gets back, through shared memory or over TCP, is
// its own, byte for byte, and none is damaged.
TEST_F(FastPathTest, TenantsChurningThroughSmallTiersOnlyEverReadTheirOwnRecords) {
  SCOPED_TRACE(rng_.Trace());
  StartCache({"--device-capacity", "32MiB", "--host-capacity", "16MiB"});  // 8 + 4 segments
  constexpr int kTenants = 4, kRounds = 24, kPerRound = 6;
  std::vector<int> delivered(kTenants, 0), wrong(kTenants, 0), corrupt(kTenants, 0);
  std::vector<std::thread> tenants;
  for (int t = 0; t < kTenants; ++t) {
    tenants.emplace_back([&, t] {
      const std::string ns = "tenant-" + std::to_string(t);
      auto fast = FastPathClient::Connect(channel_, absl::Seconds(10));
      ASSERT_TRUE(fast.ok()) << fast.status();
      std::vector<TestBlock> stored;
      for (int round = 0; round < kRounds; ++round) {
        std::vector<TestBlock> put;
        std::vector<BlockSlices> slices;
        for (int i = 0; i < kPerRound; ++i) {
          put.push_back(MakeBlock(layout_, ns, rng_.seed() + t * 100000 + round * kPerRound + i));
          slices.push_back(put.back().slices);
        }
        // A device tier whose segments all hold other tenants' pinned or
        // incomplete blocks says so; the client retries, as it is told to.
        absl::StatusOr<v1::PutResponse> stored_now = client_->Put(ns, layout_, slices);
        for (int retry = 0; retry < 100 && stored_now.status().code() == absl::StatusCode::kResourceExhausted;
             ++retry) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          stored_now = client_->Put(ns, layout_, slices);
        }
        ASSERT_TRUE(stored_now.ok()) << stored_now.status();
        stored.insert(stored.end(), put.begin(), put.end());
        // The latest blocks, some of them demoted or gone by now.
        const std::vector<TestBlock> recent(stored.end() - std::min<size_t>(stored.size(), 3 * kPerRound),
                                            stored.end());
        const auto check = [&](size_t i, const std::string& bytes) {
          ++delivered[t];
          wrong[t] += bytes != recent[i].record;
        };
        if (t % 2 == 0) {  // the others' segments are never opened by a reader
          std::vector<uint32_t> fallback;
          const auto through_shm = FetchAll(**fast, ns, Hashes(recent), &fallback);
          for (size_t i = 0; i < recent.size(); ++i) {
            if (through_shm[i].ok()) check(i, *through_shm[i]);
            corrupt[t] += through_shm[i].status().code() == absl::StatusCode::kDataLoss;
          }
        }
        std::vector<std::string> records(recent.size());
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        const grpc::Status status = RawGet(
            channel_.get(), &context, MakeGetRequest(ns, layout_, Hashes(recent)),
            [&](uint32_t i, size_t size) {
              records[i].resize(size);
              return std::span(reinterpret_cast<uint8_t*>(records[i].data()), size);
            },
            [&](const RawBlock& b) {
              if (b.status.ok()) check(b.index, records[b.index]);
              corrupt[t] += b.status.code() == absl::StatusCode::kDataLoss;
            });
        EXPECT_TRUE(status.ok()) << status.error_message();
      }
    });
  }
  for (std::thread& t : tenants) t.join();
  for (int t = 0; t < kTenants; ++t) {
    EXPECT_EQ(wrong[t], 0) << "tenant " << t << " got records that are not its own";
    EXPECT_EQ(corrupt[t], 0) << "tenant " << t << " found records damaged in the cache";
    EXPECT_GT(delivered[t], kRounds * kPerRound) << "tenant " << t << " read too little to tell";
  }
  const v1::StatsResponse stats = Stats();
  EXPECT_EQ(stats.checksum_failures(), 0u);
  EXPECT_GT(stats.tiers(0).demotions(), 0u);
  EXPECT_GT(stats.tiers(1).evictions(), 0u);
  EXPECT_GT(stats.fast_path_blocks_out(), 0u);
}

// The socket protocol refuses an unproven session, a wrong secret, another
// tenant's segment (for an admin's session too: it maps only what it read)
// and a stale generation.
TEST_F(FastPathTest, SocketProtocolRefusesWhatASessionHasNoRightTo) {
  StartCacheWithTwoTenants();
  const std::vector<TestBlock> a = PutBlocks("tenant-a", rng_.seed(), 4);
  const std::vector<TestBlock> b = PutBlocks("tenant-b", rng_.seed() + 100, 4);

  // Unproven: no leases.
  auto unproven = OpenRaw(/*prove=*/false);
  v1::LeaseBlocksResponse leased;
  EXPECT_EQ(Lease(*unproven, "tenant-a", Hashes(a), leased).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // A wrong secret is refused and the connection closed.
  {
    const int socket = *fastpath::Connect(unproven->opened.socket_path());
    fastpath::Request hello = Hello(unproven->opened);
    hello.secret[0] ^= 1;
    int fd;
    ASSERT_TRUE(fastpath::SendRequest(socket, hello).ok());
    EXPECT_EQ(fastpath::ReceiveReply(socket, fd).code(), absl::StatusCode::kPermissionDenied);
    EXPECT_FALSE(fastpath::ReceiveReply(socket, fd).ok()) << "connection stays open";
    close(socket);
  }

  auto reader_a = OpenRaw();
  auto reader_b = OpenRaw();
  v1::LeaseBlocksResponse leased_a, leased_b;
  ASSERT_TRUE(Lease(*reader_a, "tenant-a", Hashes(a), leased_a).ok());
  ASSERT_TRUE(Lease(*reader_b, "tenant-b", Hashes(b), leased_b).ok());
  // A proven session is its one connection's: the same hello, secret and
  // all, from a second connection is refused.
  {
    const int socket = *fastpath::Connect(reader_a->opened.socket_path());
    int fd;
    ASSERT_TRUE(fastpath::SendRequest(socket, Hello(reader_a->opened)).ok());
    EXPECT_EQ(fastpath::ReceiveReply(socket, fd).code(), absl::StatusCode::kPermissionDenied);
    close(socket);
  }
  ASSERT_EQ(leased_a.blocks_size(), 4);
  ASSERT_TRUE(leased_a.blocks(0).has_shared());
  ASSERT_TRUE(leased_b.blocks(0).has_shared());
  const v1::SharedPiece& piece_a = leased_a.blocks(0).shared().pieces(0);
  const v1::SharedPiece& piece_b = leased_b.blocks(0).shared().pieces(0);
  EXPECT_FALSE(piece_a.tier_index() == piece_b.tier_index() && piece_a.segment() == piece_b.segment())
      << "two namespaces in one segment";

  int fd = -1;
  ASSERT_TRUE(AskSegment(*reader_a, piece_a, fd).ok());
  ASSERT_GE(fd, 0);
  // The bytes are there, read-only.
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
  EXPECT_EQ(errno, EACCES);
  void* view = mmap(nullptr, piece_a.offset() + piece_a.length(), PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(view, MAP_FAILED);
  EXPECT_EQ(std::string_view(static_cast<const char*>(view) + piece_a.offset(), piece_a.length()),
            std::string_view(a[0].record).substr(0, piece_a.length()));
  munmap(view, piece_a.offset() + piece_a.length());
  close(fd);

  // Another namespace's segment, or a stale generation: refused.
  EXPECT_EQ(AskSegment(*reader_a, piece_b, fd).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(fd, -1);
  EXPECT_EQ(AskSegment(*reader_a, piece_a, fd, /*generation_delta=*/1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Stats().pinned_blocks(), 8u);
  // A session cannot end another's lease over its socket. (The segment
  // request after it is answered only once the release was handled.)
  fastpath::Request release{fastpath::RequestKind::kRelease};
  release.generation = leased_a.lease_id();
  ASSERT_TRUE(fastpath::SendRequest(reader_b->socket, release).ok());
  EXPECT_TRUE(AskSegment(*reader_b, piece_b, fd).ok());
  close(fd);
  EXPECT_EQ(Stats().pinned_blocks(), 8u);
  // Releasing through the ordinary RPC ends a fast-path lease.
  EXPECT_TRUE(client_->ReleaseLease(leased_a.lease_id()).ok());
  EXPECT_EQ(client_->ReleaseLease(leased_a.lease_id()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Stats().pinned_blocks(), 4u);
}

// Every way a holder of a segment's descriptor might write the segment:
// through it, or through the file reopened read-write by its /proc path
// (a memfd is a file; its mode and seals decide). Each flips a byte at
// `at`. Returns how many worked. Allocates nothing (it runs in a forked
// child too).
int WritesThatWork(int fd, const char* reopen_path, size_t bytes, size_t at) {
  int worked = 0;
  const int reopened = open(reopen_path, O_RDWR | O_CLOEXEC);
  for (const int f : {fd, reopened}) {
    if (f < 0) continue;
    char byte = 0;
    if (pread(f, &byte, 1, static_cast<off_t>(at)) != 1) continue;
    byte = static_cast<char>(byte ^ 0x20);
    worked += pwrite(f, &byte, 1, static_cast<off_t>(at)) == 1;
    if (void* w = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0); w != MAP_FAILED) {
      ++worked;
      static_cast<char*>(w)[at] ^= 0x20;
      munmap(w, bytes);
    }
    if (void* r = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, f, 0); r != MAP_FAILED) {
      if (mprotect(r, bytes, PROT_READ | PROT_WRITE) == 0) {
        ++worked;
        static_cast<char*>(r)[at] ^= 0x20;
      }
      munmap(r, bytes);
    }
    worked += fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes)) == 0;
    worked += ftruncate(f, 0) == 0;
  }
  if (reopened >= 0) close(reopened);
  return worked;
}

// A reader's descriptor is read-only for good: neither the cache's own
// user (root here, whom file modes do not stop) nor another user can write
// the segment through it or through its reopened file, and the tenant's
// block reads back as stored.
TEST_F(FastPathTest, AReaderCanNeverWriteTheSegmentsItIsGiven) {
  const std::vector<TestBlock> blocks = PutBlocks("tenant-a", rng_.seed(), 3);
  auto reader = OpenRaw();
  v1::LeaseBlocksResponse leased;
  ASSERT_TRUE(Lease(*reader, "tenant-a", Hashes(blocks), leased).ok());
  ASSERT_TRUE(leased.blocks(1).has_shared());
  const v1::SharedPiece& piece = leased.blocks(1).shared().pieces(0);
  int fd = -1;
  ASSERT_TRUE(AskSegment(*reader, piece, fd).ok());
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0400u) << "other users may reopen the segment";
  const size_t bytes = static_cast<size_t>(st.st_size);
  const size_t at = piece.offset() + std::min<size_t>(piece.length() - 1, 1000);
  const std::string path = "/proc/self/fd/" + std::to_string(fd);

  EXPECT_EQ(WritesThatWork(fd, path.c_str(), bytes, at), 0) << "as the cache's own user";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Another user; dumpable again, so that its /proc/self stays its own.
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(100);
    prctl(PR_SET_DUMPABLE, 1);
    _exit(WritesThatWork(fd, path.c_str(), bytes, at));
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "as another user (100: could not become one)";
  close(fd);

  EXPECT_TRUE(client_->ReleaseLease(leased.lease_id()).ok());
  auto got = client_->Get("tenant-a", layout_, Hashes(blocks));
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_TRUE((*got)[i].status.ok()) << i << ": " << (*got)[i].status;
    EXPECT_EQ((*got)[i].record, blocks[i].record) << i;
  }
  EXPECT_EQ(Stats().checksum_failures(), 0u);
}

// Random requests on a proven session's socket: any kind (valid or not),
// tier and segment indexes in and far out of range, generations right, off
// by one or random. The cache answers or hangs up; it never hands out a
// segment of a namespace the session has not read (of two tenants', which
// never share one), and after each request
// the session (or a new one, if it was hung up on) still reads its own
// segment. Afterwards the bytes read back as stored and, every socket
// closed, nothing stays pinned.
TEST_F(FastPathTest, RandomSocketRequestsNeverCrossNamespaces) {
  SCOPED_TRACE(rng_.Trace());
  StartCacheWithTwoTenants();
  std::mt19937_64& rng = rng_.engine();
  const std::vector<TestBlock> a = PutBlocks("tenant-a", rng_.seed(), 4);
  const std::vector<TestBlock> b = PutBlocks("tenant-b", rng_.seed() + 100, 4);
  auto other = OpenRaw();
  v1::LeaseBlocksResponse leased_b;
  ASSERT_TRUE(Lease(*other, "tenant-b", Hashes(b), leased_b).ok());
  std::set<std::pair<uint32_t, uint32_t>> b_segments;  // (tier, segment)
  std::vector<v1::SharedPiece> pieces;
  for (const v1::LeasedBlock& block : leased_b.blocks()) {
    for (const v1::SharedPiece& piece : block.shared().pieces()) {
      b_segments.insert({piece.tier_index(), piece.segment()});
      pieces.push_back(piece);
    }
  }
  std::unique_ptr<RawSession> session;
  v1::SharedPiece own;
  auto open = [&] {
    session = OpenRaw();
    v1::LeaseBlocksResponse leased_a;
    ASSERT_TRUE(Lease(*session, "tenant-a", Hashes(a), leased_a).ok());
    own = leased_a.blocks(0).shared().pieces(0);
    pieces.push_back(own);
  };
  open();
  for (int round = 0; round < 1000; ++round) {
    fastpath::Request request{};
    const uint32_t kinds[] = {0, 1, 2, 2, 2, 3, 3, 4, static_cast<uint32_t>(rng())};
    request.kind = static_cast<fastpath::RequestKind>(kinds[rng() % std::size(kinds)]);
    const v1::SharedPiece& like = pieces[rng() % pieces.size()];
    request.tier = rng() % 4 == 0 ? static_cast<uint32_t>(rng()) : like.tier_index() + rng() % 2;
    request.segment = rng() % 4 == 0 ? static_cast<uint32_t>(rng()) : like.segment() + rng() % 3;
    const uint64_t generations[] = {like.generation(), like.generation(), like.generation() + 1, rng(),
                                    leased_b.lease_id()};
    request.generation = generations[rng() % std::size(generations)];
    request.session_id = rng() % 2 ? session->opened.session_id() : rng();
    for (uint8_t& byte : request.secret) byte = static_cast<uint8_t>(rng());
    ASSERT_TRUE(fastpath::SendRequest(session->socket, request).ok());
    int fd = -1;
    if (request.kind == fastpath::RequestKind::kSegment) {
      const absl::Status answer = fastpath::ReceiveReply(session->socket, fd);
      if (fd >= 0) close(fd);
      if (answer.ok()) {
        EXPECT_FALSE(b_segments.contains({request.tier, request.segment}))
            << "tenant-a's session got tenant-b's segment " << request.segment << " of tier " << request.tier;
      }
    }
    // The session still reads its own segment; or it was hung up on (a
    // request of another kind): then a new one must.
    if (request.kind != fastpath::RequestKind::kSegment && request.kind != fastpath::RequestKind::kRelease) {
      const absl::Status refused = fastpath::ReceiveReply(session->socket, fd);
      EXPECT_FALSE(refused.ok()) << "kind " << static_cast<uint32_t>(request.kind);
      open();
    }
    ASSERT_TRUE(AskSegment(*session, own, fd).ok()) << "round " << round;
    close(fd);
  }
  EXPECT_TRUE(SameRecords(
      FetchAll(*FastPathClient::Connect(channel_, absl::Seconds(10), 0).value(), "tenant-a", Hashes(a)), a));
  session.reset();
  other.reset();
  EXPECT_TRUE(StatsBecome([](const v1::StatsResponse& s) { return s.pinned_blocks() == 0; }));
}

TEST_F(FastPathTest, LeasesExpireAtTheirDeadline) {
  const std::vector<TestBlock> blocks = PutBlocks("tenant-a", rng_.seed(), 3);
  auto session = OpenRaw();
  v1::LeaseBlocksResponse leased;
  ASSERT_TRUE(Lease(*session, "tenant-a", Hashes(blocks), leased, /*ttl_ms=*/300).ok());
  EXPECT_EQ(Stats().pinned_blocks(), 3u);
  EXPECT_TRUE(StatsBecome([](const v1::StatsResponse& s) { return s.pinned_blocks() == 0; }));
  EXPECT_GE(absl::Now(), absl::FromUnixMillis(leased.lease_deadline_unix_ms()));
  EXPECT_EQ(client_->ReleaseLease(leased.lease_id()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Stats().fast_path_sessions(), 1u) << "the session outlives its leases";
}

TEST_F(FastPathTest, AClientKilledHoldingLeasesLeavesNothingPinned) {
  const std::vector<TestBlock> blocks = PutBlocks("tenant-a", rng_.seed(), 5);
  ChildProcess holder({KVTIER_HOLDER_BINARY, target_, "tenant-a", std::to_string(rng_.seed()), "5"});
  ASSERT_TRUE(holder.WaitForLine("holding ").has_value());
  v1::StatsResponse held = Stats();
  EXPECT_EQ(held.pinned_blocks(), 5u);
  EXPECT_EQ(held.fast_path_sessions(), 1u);
  EXPECT_EQ(holder.Stop(SIGKILL), 128 + SIGKILL);
  // Its socket closed: the cache ends the session and its leases at once
  // (the 30 s lease deadline would do it otherwise).
  EXPECT_TRUE(
      StatsBecome([](const v1::StatsResponse& s) { return s.pinned_blocks() == 0 && s.fast_path_sessions() == 0; }));
}

TEST_F(FastPathTest, CacheRestartUnderAClientsMappingsNeverGivesOldBytes) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<TestBlock> before = PutBlocks("tenant-a", rng_.seed(), 6);
  auto shards = cache::ShardSet::Create(target_, absl::Seconds(5), /*fast_path=*/true);
  ASSERT_TRUE(shards.ok());
  auto check = [&](const std::vector<TestBlock>& expected) {
    return SameRecords((*shards)->Fetch("tenant-a", layout_, Hashes(before)), expected);
  };
  EXPECT_TRUE(check(before));
  auto standalone = FastPathClient::Connect(channel_, absl::Seconds(5));
  ASSERT_TRUE(standalone.ok());
  FetchAll(**standalone, "tenant-a", Hashes(before));
  ASSERT_GT((*standalone)->mapped_segments(), 0u);
  EXPECT_EQ(Stats().fast_path_sessions(), 2u);

  // A new cache on the same port holds other bytes under the same hashes.
  const int port = port_;
  EXPECT_EQ(cache_->Stop(SIGKILL), 128 + SIGKILL);
  StartCache({}, port);
  std::vector<TestBlock> after;
  std::vector<BlockSlices> slices;
  for (size_t i = 0; i < before.size(); ++i) {
    TestBlock b = MakeBlock(layout_, "tenant-a", rng_.seed() + 500 + i);
    b.slices.hash = before[i].slices.hash;
    after.push_back(b);
    slices.push_back(b.slices);
  }
  ASSERT_TRUE(client_->Put("tenant-a", layout_, slices).ok());

  // The old session is gone: an error, not a crash or stale bytes.
  std::string sink;
  auto old = (*standalone)
                 ->Fetch(
                     "tenant-a", layout_, Hashes(before),
                     [&](uint32_t, size_t size) {
                       sink.resize(size);
                       return std::span(reinterpret_cast<uint8_t*>(sink.data()), size);
                     },
                     [&](const RawBlock&) { ADD_FAILURE() << "delivered through a dead session"; });
  EXPECT_FALSE(old.ok());
  // The shard set reconnects (its channel may first need a moment) and
  // reads the new bytes, over a new session.
  EXPECT_TRUE(testing::Eventually([&] { return check(after); }, std::chrono::seconds(5)));
  EXPECT_TRUE(check(after));
  EXPECT_GT(Stats().fast_path_blocks_out(), 0u) << "the new cache served by the fast path";
}

// Flips a byte of `record` wherever the cache's segments hold it, through
// the cache's own writable mappings (/proc/PID/mem: the test is its parent),
// as failing memory would: the segments' memfds take no other writer.
int CorruptInCache(pid_t cache, const std::string& record) {
  int hits = 0;
  const std::string proc = "/proc/" + std::to_string(cache);
  std::ifstream maps(proc + "/maps");
  const int mem = open((proc + "/mem").c_str(), O_RDWR);
  if (mem < 0) return 0;
  // Segments' mappings, those next to each other joined: a record may
  // span two segments, which lie side by side in the arena's addresses.
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("kvtier-cache-segment") == std::string::npos) continue;
    uint64_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64, &begin, &end) != 2) continue;
    if (!runs.empty() && runs.back().second == begin) {
      runs.back().second = end;
    } else {
      runs.push_back({begin, end});
    }
  }
  for (const auto& [begin, end] : runs) {
    std::string bytes(end - begin, '\0');
    if (pread(mem, bytes.data(), bytes.size(), static_cast<off_t>(begin)) != static_cast<ssize_t>(bytes.size())) {
      continue;
    }
    const size_t at = bytes.find(record);
    if (at == std::string::npos) continue;
    const char flipped = static_cast<char>(bytes[at + 1000] ^ 0x10);
    hits += pwrite(mem, &flipped, 1, static_cast<off_t>(begin + at + 1000)) == 1;
  }
  close(mem);
  return hits;
}

TEST_F(FastPathTest, ACorruptRecordIsNeverDeliveredAndIsCountedOverTcp) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<TestBlock> blocks = PutBlocks("tenant-a", rng_.seed(), 3);
  ASSERT_EQ(CorruptInCache(cache_->pid(), blocks[1].record), 1);
  auto fast = FastPathClient::Connect(channel_, absl::Seconds(5));
  ASSERT_TRUE(fast.ok());
  std::vector<uint32_t> fallback;
  const auto got = FetchAll(**fast, "tenant-a", Hashes(blocks), &fallback);
  EXPECT_EQ(fallback, std::vector<uint32_t>{1}) << "the reader's check refuses it";
  EXPECT_EQ(*got[0], blocks[0].record);
  EXPECT_EQ(got[1].status().code(), absl::StatusCode::kUnknown) << "not delivered";
  EXPECT_EQ(*got[2], blocks[2].record);
  // The shard set reads it over TCP, where the cache finds it, drops it and
  // counts it.
  auto shards = cache::ShardSet::Create(target_, absl::Seconds(5), /*fast_path=*/true);
  ASSERT_TRUE(shards.ok());
  const auto fetched = (*shards)->Fetch("tenant-a", layout_, Hashes(blocks));
  EXPECT_EQ(fetched[1].status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(**fetched[0], blocks[0].record);
  EXPECT_EQ(Stats().checksum_failures(), 1u);
}

// One Put stream of `messages`; its status and answer.
grpc::Status PutStream(CacheClient& client, const std::vector<v1::PutRequest>& messages, v1::PutResponse* response) {
  grpc::ClientContext context;
  client.SetDeadline(context);
  auto writer = client.stub().Put(&context, response);
  for (const v1::PutRequest& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

v1::PutRequest Header(const std::string& ns, const kvblock::LatentLayout& layout, uint64_t session) {
  v1::PutRequest header;
  header.mutable_header()->set_kv_namespace(ns);
  *header.mutable_header()->mutable_layout() = kvblock::LayoutToProto(layout);
  header.mutable_header()->set_fast_path_session_id(session);
  return header;
}

v1::PutRequest StagedSlice(const BlockHash& hash, const v1::StagedRange& range) {
  v1::PutRequest slice;
  slice.mutable_slice()->set_block_hash(std::string(kvblock::HashAsBytes(hash)));
  *slice.mutable_slice()->mutable_staged() = range;
  return slice;
}

TEST_F(FastPathTest, StagedPutStoresWhatTheClientWroteInItsRegion) {
  SCOPED_TRACE(rng_.Trace());
  auto fast = FastPathClient::Connect(channel_, absl::Seconds(5), /*staging_bytes=*/8 << 20);
  ASSERT_TRUE(fast.ok()) << fast.status();
  ASSERT_EQ((*fast)->staging_bytes(), 8u << 20);
  std::vector<TestBlock> blocks;
  std::vector<v1::PutRequest> messages = {Header("tenant-a", layout_, (*fast)->session_id())};
  uint64_t staged_bytes = 0;
  {
    FastPathClient::StagedStream stream(fast->get());
    for (int i = 0; i < 5; ++i) {
      blocks.push_back(MakeBlock(layout_, "tenant-a", rng_.seed() + i));
      for (const std::string& record : blocks.back().slices.records) {
        std::optional<v1::StagedRange> range = stream.Stage(record);
        ASSERT_TRUE(range.has_value());
        messages.push_back(StagedSlice(blocks.back().slices.hash, *range));
        staged_bytes += record.size();
      }
    }
    v1::PutResponse response;
    const grpc::Status status = PutStream(*client_, messages, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.blocks_stored(), 5u);
  }
  // The same, many slices to a message (SliceBatch).
  {
    FastPathClient::StagedStream stream(fast->get());
    v1::PutRequest batch;
    for (int i = 5; i < 10; ++i) {
      blocks.push_back(MakeBlock(layout_, "tenant-a", rng_.seed() + i));
      for (const std::string& record : blocks.back().slices.records) {
        v1::LayerSlice* slice = batch.mutable_batch()->add_slices();
        slice->set_block_hash(std::string(kvblock::HashAsBytes(blocks.back().slices.hash)));
        *slice->mutable_staged() = *stream.Stage(record);
        staged_bytes += record.size();
      }
    }
    v1::PutResponse response;
    const grpc::Status status =
        PutStream(*client_, {Header("tenant-a", layout_, (*fast)->session_id()), batch}, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.blocks_stored(), 5u);
  }
  auto got = client_->Get("tenant-a", layout_, Hashes(blocks));
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < blocks.size(); ++i) EXPECT_EQ((*got)[i].record, blocks[i].record) << i;
  const v1::StatsResponse stats = Stats();
  EXPECT_EQ(stats.fast_path_bytes_in(), staged_bytes);
  EXPECT_EQ(stats.fast_path_staging_bytes(), 8u << 20);
  fast->reset();  // the session ends: its region goes back to the budget
  EXPECT_TRUE(StatsBecome([](const v1::StatsResponse& s) { return s.fast_path_staging_bytes() == 0; }));
}

TEST_F(FastPathTest, BadStagedSlicesGetClearErrorsAndStoreNothing) {
  auto fast = FastPathClient::Connect(channel_, absl::Seconds(5), /*staging_bytes=*/8 << 20);
  ASSERT_TRUE(fast.ok());
  const uint64_t session = (*fast)->session_id();
  const TestBlock block = MakeBlock(layout_, "tenant-a", rng_.seed());
  const BlockHash hash = block.slices.hash;
  FastPathClient::StagedStream stream(fast->get());
  const std::optional<v1::StagedRange> staged = stream.Stage(block.slices.records[0]);
  ASSERT_TRUE(staged.has_value());
  const v1::StagedRange good = *staged;
  v1::StagedRange outside = good;
  outside.set_offset((8 << 20) - 10);
  v1::StagedRange overflowing = good;
  overflowing.set_offset(~uint64_t{0} - 4);
  struct Case {
    const char* what;
    std::vector<v1::PutRequest> messages;
    grpc::StatusCode code;
  };
  const Case cases[] = {
      {"staged slice, no session in the header",
       {Header("tenant-a", layout_, 0), StagedSlice(hash, good)},
       grpc::StatusCode::INVALID_ARGUMENT},
      {"unknown session",
       {Header("tenant-a", layout_, session ^ 1), StagedSlice(hash, good)},
       grpc::StatusCode::FAILED_PRECONDITION},
      {"range past the region",
       {Header("tenant-a", layout_, session), StagedSlice(hash, outside)},
       grpc::StatusCode::INVALID_ARGUMENT},
      {"range overflowing",
       {Header("tenant-a", layout_, session), StagedSlice(hash, overflowing)},
       grpc::StatusCode::INVALID_ARGUMENT},
  };
  for (const Case& c : cases) {
    v1::PutResponse response;
    EXPECT_EQ(PutStream(*client_, c.messages, &response).error_code(), c.code) << c.what;
  }
  // A batch is checked slice by slice (the bad one fails the stream), and
  // may not be larger than the limit.
  v1::PutRequest batch;
  *batch.mutable_batch()->add_slices() = StagedSlice(hash, good).slice();
  *batch.mutable_batch()->add_slices() = StagedSlice(hash, outside).slice();
  v1::PutResponse batch_response;
  EXPECT_EQ(PutStream(*client_, {Header("tenant-a", layout_, session), batch}, &batch_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::PutRequest huge;
  for (int i = 0; i < 4097; ++i) *huge.mutable_batch()->add_slices() = StagedSlice(hash, good).slice();
  EXPECT_EQ(PutStream(*client_, {Header("tenant-a", layout_, session), huge}, &batch_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // A record changed after staging fails its checksum, counted.
  FastPathClient::StagedStream corrupt(fast->get());
  std::string bad = block.slices.records[1];
  bad[100] ^= 1;
  const std::optional<v1::StagedRange> bad_range = corrupt.Stage(bad);
  ASSERT_TRUE(bad_range.has_value());
  v1::PutResponse response;
  EXPECT_EQ(PutStream(*client_, {Header("tenant-a", layout_, session), StagedSlice(hash, *bad_range)}, &response)
                .error_code(),
            grpc::StatusCode::DATA_LOSS);
  const v1::StatsResponse stats = Stats();
  EXPECT_EQ(stats.arrival_checksum_failures(), 1u);
  EXPECT_EQ(stats.checksum_failures(), 0u) << "no stored record went bad";
  EXPECT_EQ(stats.blocks_stored(), 0u);
  EXPECT_EQ(stats.pending_blocks(), 0u);
}

// With the device tier in memory the process reaches only by copies (as a
// GPU's; `staged-host` stands in for it here), blocks there go over TCP and
// blocks in the host tier through shared memory, without being promoted.
TEST_F(FastPathTest, DeviceTierOutsideSharedMemoryFallsBackToTcp) {
  SCOPED_TRACE(rng_.Trace());
  StartCache({"--device-memory", "staged-host"});
  // 36 MB through a 32 MiB device tier: the oldest blocks go down to host.
  const std::vector<TestBlock> blocks = PutBlocks("tenant-a", rng_.seed(), 120);
  auto fast = FastPathClient::Connect(channel_, absl::Seconds(10));
  ASSERT_TRUE(fast.ok()) << fast.status();
  std::vector<uint32_t> fallback;
  const auto got = FetchAll(**fast, "tenant-a", Hashes(blocks), &fallback);
  EXPECT_FALSE(fallback.empty()) << "device-tier blocks are not in shared memory";
  EXPECT_LT(fallback.size(), blocks.size()) << "host-tier blocks are";
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (std::find(fallback.begin(), fallback.end(), i) != fallback.end()) continue;
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    EXPECT_EQ(*got[i], blocks[i].record) << i;
  }
  const v1::StatsResponse stats = Stats();
  EXPECT_EQ(stats.fast_path_blocks_out(), blocks.size() - fallback.size());
  EXPECT_EQ(stats.tiers(0).promotions(), 0u) << "fast path reads do not promote into the slab";
  // The shard set reads the rest over TCP: every block, right.
  auto shards = cache::ShardSet::Create(target_, absl::Seconds(10), /*fast_path=*/true);
  ASSERT_TRUE(shards.ok());
  std::set<const char*> first_memory;
  {
    const auto fetched = (*shards)->Fetch("tenant-a", layout_, Hashes(blocks));
    EXPECT_TRUE(SameRecords(fetched, blocks));
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (!fetched[i].ok()) continue;
      first_memory.insert((*fetched[i])->data());
      // Sound whichever way it came (Fetch hands on only records it checked).
      EXPECT_TRUE(kvblock::ParseBlock(**fetched[i], &layout_).ok()) << i;
    }
  }
  // Again, once those records are let go: the same memory (no fresh pages
  // to fault in), every byte written again.
  const auto again = (*shards)->Fetch("tenant-a", layout_, Hashes(blocks));
  EXPECT_TRUE(SameRecords(again, blocks));
  std::set<const char*> second_memory;
  for (const auto& r : again) second_memory.insert(r.ok() ? (*r)->data() : nullptr);
  EXPECT_EQ(second_memory, first_memory);
}

// A prefill node's Put stream to a cache on another host: inline slices
// many to a message, flushed at the message limits (here 320 slices of
// 38 KB: both the slice count and the byte limit are reached) and at the
// end; every block stored, byte for byte.
TEST_F(FastPathTest, ShardedPutSendsInlineSlicesManyToAMessage) {
  StartCache({"--no-fast-path"});
  std::vector<TestBlock> blocks;
  for (uint64_t i = 0; i < 40; ++i) blocks.push_back(MakeBlock(layout_, "tenant-a", rng_.seed() + i));
  auto shards = cache::ShardSet::Create(target_, absl::Seconds(10), /*fast_path=*/true);
  ASSERT_TRUE(shards.ok());
  std::set<kvblock::BlockHash> stored;
  {
    cache::ShardedPut put(**shards, "tenant-a", layout_, absl::Seconds(10));
    for (uint32_t l = 0; l < layout_.num_layers; ++l) {
      for (const TestBlock& b : blocks) put.Write(b.slices.hash, b.slices.records[l]);
    }
    stored = put.Finish();
  }
  EXPECT_EQ(stored.size(), blocks.size());
  EXPECT_EQ(Stats().blocks_stored(), blocks.size());
  EXPECT_TRUE(SameRecords((*shards)->Fetch("tenant-a", layout_, Hashes(blocks)), blocks));
}

TEST_F(FastPathTest, CacheWithoutFastPathIsReadOverTcp) {
  StartCache({"--no-fast-path"});
  const std::vector<TestBlock> blocks = PutBlocks("tenant-a", rng_.seed(), 3);
  EXPECT_EQ(FastPathClient::Connect(channel_, absl::Seconds(5)).status().code(), absl::StatusCode::kFailedPrecondition);
  auto shards = cache::ShardSet::Create(target_, absl::Seconds(5), /*fast_path=*/true);
  ASSERT_TRUE(shards.ok());
  EXPECT_TRUE(SameRecords((*shards)->Fetch("tenant-a", layout_, Hashes(blocks)), blocks));
  EXPECT_EQ(Stats().fast_path_blocks_out(), 0u);
}

}  // namespace
}  // namespace kvtier::cache
