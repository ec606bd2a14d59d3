// FastPathServer with a hand-driven clock: unproven sessions and silent
// connections are dropped after prove_within, leases end at their deadline
// and when the session's socket closes.
#include "services/cache/fast_path/fast_path_server.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <random>

#include "absl/time/clock.h"
#include "services/cache/fast_path/fast_path_socket.h"
#include "services/kvblock/block_format.h"
#include "tests/cache/store/recording_slab.h"
#include "tests/integration/test_certificates.h"
#include "tests/temp_dir.h"
#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

namespace fs = std::filesystem;

kvblock::LatentLayout Layout() {
  return {.model_id = "fast-path-server-test",
          .num_layers = 2,
          .kv_lora_rank = 24,
          .rope_dim = 8,
          .tokens_per_block = 16,
          .codec = kernels::Codec::kInt8};
}

class FastPathServerTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(nullptr, FastPathOptions()); }

  // A store whose device tier is `device_slab` (null: host memory) and a
  // server with `f` but for its socket and proof time.
  void Start(std::shared_ptr<SlabMemory> device_slab, FastPathOptions f) {
    server_.reset();
    StoreOptions o;
    o.page_size = 4096;
    o.device_capacity = o.host_capacity = 64 * 4096;
    o.shared_memory = true;
    o.device_slab = std::move(device_slab);
    store_ = *BlockStore::Create(o, &clock_);
    f.socket_path = "@kvtier-fast-path-server-test-" + std::to_string(getpid()) + "-" + std::to_string(rng_.seed());
    f.prove_within = absl::Seconds(10);
    server_ = *FastPathServer::Start(f, store_.get(), &clock_);
  }

  kvblock::BlockHash PutBlock(int i) {
    std::vector<uint32_t> tokens(16, static_cast<uint32_t>(i));
    const kvblock::BlockHash hash = kvblock::ChainHash("ns", kvblock::kNoParent, kvblock::LayoutId(layout_), tokens);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(size_t{2} * layout_.LayerShape().values());
    for (float& v : x) v = normal(rng_.engine());
    auto session = store_->BeginPut("ns", layout_);
    EXPECT_TRUE(session->AddSlice(hash, *kvblock::EncodeBlock(layout_, 0, 2, x)).ok());
    session->Finish();
    return hash;
  }

  // Proves an opened session over a new connection, kept in `socket`; the
  // staging region's descriptor (or -1) in `fd`, the device grant in `device`.
  static absl::Status Prove(const v1::OpenFastPathResponse& opened, int& socket, int& fd,
                            fastpath::DeviceGrant* device = nullptr) {
    socket = *fastpath::Connect(opened.socket_path());
    fastpath::Request hello{fastpath::RequestKind::kHello};
    hello.session_id = opened.session_id();
    std::memcpy(hello.secret.data(), opened.secret().data(), 16);
    if (absl::Status s = fastpath::SendRequest(socket, hello); !s.ok()) return s;
    return fastpath::ReceiveReply(socket, fd, device);
  }

  // Opens and proves a session; returns its id and keeps its socket in `socket`.
  uint64_t Proven(int& socket) {
    v1::OpenFastPathResponse opened = *server_->Open(v1::OpenFastPathRequest());
    int fd;
    EXPECT_TRUE(Prove(opened, socket, fd).ok());
    return opened.session_id();
  }

  // A tenants file's tenants, as a reload hands them over.
  static TenantRegistry::TenantList Tenants(const std::vector<std::pair<std::string, v1::TenantRole>>& roles) {
    TenantRegistry::TenantList tenants;
    for (const auto& [name, role] : roles) {
      auto tenant = std::make_shared<Caller>();
      tenant->tenant = name;
      tenant->role = role;
      tenants.push_back(std::move(tenant));
    }
    return tenants;
  }

  testing::SeededRng rng_;
  ManualClock clock_;
  kvblock::LatentLayout layout_ = Layout();
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<FastPathServer> server_;
};

TEST_F(FastPathServerTest, LeasesEndAtTheirDeadline) {
  const kvblock::BlockHash hash = PutBlock(1);
  int socket;
  const uint64_t session = Proven(socket);
  v1::LeaseBlocksResponse response;
  ASSERT_TRUE(server_->Lease(session, "ns", kvblock::LayoutId(layout_), {hash}, absl::Seconds(1), response).ok());
  ASSERT_TRUE(response.blocks(0).has_shared());
  EXPECT_EQ(store_->Stats().pinned_blocks, 1u);
  clock_.Advance(absl::Milliseconds(999));
  EXPECT_EQ(server_->Counters().blocks_out, 1u);  // expires what is due: nothing yet
  EXPECT_EQ(store_->Stats().pinned_blocks, 1u);
  clock_.Advance(absl::Milliseconds(1));
  (void)server_->Counters();
  EXPECT_EQ(store_->Stats().pinned_blocks, 0u);
  EXPECT_EQ(server_->Release(response.lease_id()).code(), absl::StatusCode::kNotFound);
  close(socket);
}

TEST_F(FastPathServerTest, ClosingTheSocketEndsTheSessionAndItsLeases) {
  const kvblock::BlockHash hash = PutBlock(2);
  int socket;
  const uint64_t session = Proven(socket);
  v1::LeaseBlocksResponse response;
  ASSERT_TRUE(server_->Lease(session, "ns", kvblock::LayoutId(layout_), {hash}, absl::Minutes(5), response).ok());
  EXPECT_EQ(server_->Counters().sessions, 1u);
  close(socket);
  // The socket's thread notices at once; wait for it (no clock involved).
  EXPECT_TRUE(server_->AwaitSessions(0, absl::Seconds(5)));
  EXPECT_EQ(server_->Counters().sessions, 0u);
  EXPECT_EQ(store_->Stats().pinned_blocks, 0u);
  v1::LeaseBlocksResponse again;
  EXPECT_EQ(server_->Lease(session, "ns", kvblock::LayoutId(layout_), {hash}, absl::ZeroDuration(), again).code(),
            absl::StatusCode::kFailedPrecondition);
}

// KeepTenants (a tenants file reloaded): the sessions of tenants it does
// not name end, proven or not, their leases with them; those it names
// serve on; and the others cannot open another.
TEST_F(FastPathServerTest, SessionsOfTenantsNotKeptEnd) {
  const kvblock::BlockHash hash = PutBlock(4);
  Caller a, b, c;
  a.tenant = "tenant-a";
  b.tenant = "tenant-b";
  c.tenant = "tenant-c";
  int socket_a, socket_b, fd;
  const v1::OpenFastPathResponse opened_a = *server_->Open({}, a), opened_b = *server_->Open({}, b);
  ASSERT_TRUE(Prove(opened_a, socket_a, fd).ok());
  ASSERT_TRUE(Prove(opened_b, socket_b, fd).ok());
  const v1::OpenFastPathResponse unproven_c = *server_->Open({}, c);
  v1::LeaseBlocksResponse response;
  ASSERT_TRUE(
      server_->Lease(opened_b.session_id(), "ns", kvblock::LayoutId(layout_), {hash}, absl::Minutes(5), response, b)
          .ok());
  ASSERT_EQ(store_->Stats().pinned_blocks, 1u);

  EXPECT_EQ(server_->KeepTenants(Tenants({{"tenant-a", v1::WRITER}, {"tenant-d", v1::WRITER}})),
            (std::vector<std::string>{"tenant tenant-b is no longer in the file: its fast path sessions end",
                                      "tenant tenant-c is no longer in the file: its fast path sessions end"}));
  EXPECT_EQ(server_->Open({}, b).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(server_->AwaitSessions(1, absl::Seconds(5)));
  EXPECT_EQ(store_->Stats().pinned_blocks, 0u) << "tenant-b's lease outlived its session";
  char byte;
  EXPECT_EQ(recv(socket_b, &byte, 1, MSG_DONTWAIT), 0) << "tenant-b's connection was not closed";
  int socket_c;
  EXPECT_FALSE(Prove(unproven_c, socket_c, fd).ok()) << "tenant-c's unproven session outlived KeepTenants";
  EXPECT_TRUE(
      server_->Lease(opened_a.session_id(), "ns", kvblock::LayoutId(layout_), {hash}, absl::Minutes(5), response, a)
          .ok());
  EXPECT_TRUE(server_->Open({}, a).ok());
  EXPECT_TRUE(server_->KeepTenants(Tenants({{"tenant-a", v1::ADMIN}})).empty());
  close(socket_a), close(socket_b), close(socket_c);
}

// A maxSessions lowered under what a tenant holds holds at the reload: its
// newest sessions beyond it end, proven or not, their leases with them;
// its oldest serve on, and it opens no more. Another tenant, and one whose
// limit was not lowered, keep theirs.
TEST_F(FastPathServerTest, SessionsBeyondALoweredMaxSessionsEnd) {
  const kvblock::BlockHash hash = PutBlock(5);
  Caller acme, other;
  acme.tenant = "acme";
  other.tenant = "other";
  int first_socket, second_socket, other_socket, fd;
  const v1::OpenFastPathResponse first = *server_->Open({}, acme), second = *server_->Open({}, acme);
  ASSERT_TRUE(Prove(first, first_socket, fd).ok());
  ASSERT_TRUE(Prove(second, second_socket, fd).ok());
  const v1::OpenFastPathResponse third = *server_->Open({}, acme);  // left unproven
  ASSERT_TRUE(Prove(*server_->Open({}, other), other_socket, fd).ok());
  v1::LeaseBlocksResponse response;
  ASSERT_TRUE(
      server_->Lease(second.session_id(), "ns", kvblock::LayoutId(layout_), {hash}, absl::Minutes(5), response, acme)
          .ok());
  ASSERT_EQ(store_->Stats().pinned_blocks, 1u);

  TenantRegistry::TenantList tenants = Tenants({{"acme", v1::WRITER}, {"other", v1::WRITER}});
  auto lowered = std::make_shared<Caller>(*tenants[0]);
  lowered->quota.set_max_sessions(1);
  tenants[0] = lowered;
  EXPECT_EQ(server_->KeepTenants(tenants),
            std::vector<std::string>{"tenant acme may hold 1 fast path session now: its 2 newest end"});
  EXPECT_TRUE(server_->AwaitSessions(2, absl::Seconds(5)));
  EXPECT_EQ(store_->Stats().pinned_blocks, 0u) << "the second session's lease outlived it";
  char byte;
  EXPECT_EQ(recv(second_socket, &byte, 1, MSG_DONTWAIT), 0) << "the second session's connection was not closed";
  int third_socket;
  EXPECT_FALSE(Prove(third, third_socket, fd).ok()) << "the unproven third session outlived the reload";
  EXPECT_TRUE(
      server_->Lease(first.session_id(), "ns", kvblock::LayoutId(layout_), {hash}, absl::Minutes(5), response, acme)
          .ok())
      << "the oldest session ended";
  EXPECT_EQ(server_->Open({}, *lowered).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(server_->KeepTenants(tenants).empty()) << "a second reload of the same file ends more";
  close(first_socket), close(second_socket), close(third_socket), close(other_socket);
}

// A reader's Puts are refused, so its session gets no staging region to
// hold from the budget; a service's session does, though it acts for a
// reader (it writes for every tenant it serves).
TEST_F(FastPathServerTest, AReadersSessionGetsNoStaging) {
  v1::OpenFastPathRequest wants;
  wants.set_staging_bytes(1 << 20);
  Caller reader;
  reader.tenant = "reader";
  reader.role = v1::READER;
  const v1::OpenFastPathResponse opened = *server_->Open(wants, reader);
  EXPECT_EQ(opened.staging_bytes(), 0u);
  int socket, fd = -1;
  ASSERT_TRUE(Prove(opened, socket, fd).ok());
  EXPECT_EQ(fd, -1) << "the reader's session got a staging region";
  EXPECT_EQ(server_->Counters().staging_bytes, 0u);
  Caller acting = reader;
  acting.service = "prefill";
  int service_socket, service_fd = -1;
  ASSERT_TRUE(Prove(*server_->Open(wants, acting), service_socket, service_fd).ok());
  EXPECT_GE(service_fd, 0) << "the service's session got no staging region";
  EXPECT_EQ(server_->Counters().staging_bytes, 1u << 20);
  close(socket), close(service_socket), close(service_fd);
}

// A reload that changes a tenant's right to write ends its sessions: one
// turned reader gives its staging back to the budget, one turned writer
// opens sessions that get staging; a session opened by a call
// authenticated under the old file follows the new one.
TEST_F(FastPathServerTest, SessionsOfATenantWhoseRightToWriteChangedEnd) {
  v1::OpenFastPathRequest wants;
  wants.set_staging_bytes(1 << 20);
  Caller acme, other;
  acme.tenant = "acme";
  acme.role = v1::WRITER;
  other.tenant = "other";
  other.role = v1::WRITER;
  int socket, other_socket, fd = -1, other_fd = -1;
  ASSERT_TRUE(Prove(*server_->Open(wants, acme), socket, fd).ok());
  ASSERT_TRUE(Prove(*server_->Open(wants, other), other_socket, other_fd).ok());
  ASSERT_EQ(server_->Counters().staging_bytes, 2u << 20);
  close(fd), close(other_fd);

  EXPECT_EQ(server_->KeepTenants(Tenants({{"acme", v1::READER}, {"other", v1::WRITER}})),
            std::vector<std::string>{"tenant acme may no longer write: its fast path sessions end"});
  EXPECT_TRUE(server_->AwaitSessions(1, absl::Seconds(5)));
  EXPECT_EQ(server_->Counters().staging_bytes, 1u << 20) << "acme's session kept its staging region";
  char byte;
  EXPECT_EQ(recv(socket, &byte, 1, MSG_DONTWAIT), 0) << "acme's connection was not closed";
  close(socket);
  const v1::OpenFastPathResponse as_reader = *server_->Open(wants, acme);  // authenticated before the reload
  EXPECT_EQ(as_reader.staging_bytes(), 0u);
  ASSERT_TRUE(Prove(as_reader, socket, fd).ok());
  EXPECT_EQ(fd, -1);

  EXPECT_EQ(server_->KeepTenants(Tenants({{"acme", v1::WRITER}, {"other", v1::WRITER}})),
            std::vector<std::string>{"tenant acme may write now: its fast path sessions end"});
  EXPECT_TRUE(server_->AwaitSessions(1, absl::Seconds(5)));
  close(socket);
  ASSERT_TRUE(Prove(*server_->Open(wants, acme), socket, fd).ok());
  EXPECT_GE(fd, 0) << "acme's new session got no staging region";
  EXPECT_EQ(server_->Counters().staging_bytes, 2u << 20);
  close(socket), close(fd), close(other_socket);
}

// A session outlives the connection that opened it, so it keeps the
// certificate chain its client presented: once the trust in force no
// longer verifies it (a newer ca.crl revokes it), the session ends, proven
// or not, its leases with it, and the client's next Open is refused; other
// clients' sessions, and one opened without a certificate, serve on. A
// certificate that expires ends its session then, with no change of files.
TEST_F(FastPathServerTest, ASessionEndsOnceItsClientCertificateNoLongerVerifies) {
  testing::TempDir dir("kvtier-fast-path-trust-");
  testing::TestCa ca(dir.path() / "ca", "kvtier test CA");
  const auto chain_of = [&](const std::string& cn, int64_t expires_in_seconds = 0) {
    if (expires_in_seconds == 0) {
      ca.Issue(dir.path() / cn, cn, "DNS:" + cn);
    } else {
      const int64_t now = absl::ToUnixSeconds(absl::Now());
      ca.Issue(dir.path() / cn, cn, "DNS:" + cn, testing::TestCa::Asn1Time(now - 60),
               testing::TestCa::Asn1Time(now + expires_in_seconds));
    }
    return testing::Contents(dir.path() / cn / "tls.crt");
  };
  const std::string wayne = chain_of("wayne"), acme = chain_of("acme");
  const std::string ca_pem = testing::Contents(dir.path() / "ca" / "ca.crt");
  absl::Mutex mu;
  std::shared_ptr<const PeerTrust> in_force = *PeerTrust::Make(ca_pem, {});
  FastPathOptions f;
  f.trust = [&] {
    absl::MutexLock lock(&mu);
    return in_force;
  };
  Start(nullptr, f);
  const kvblock::BlockHash hash = PutBlock(6);
  int wayne_socket, acme_socket, plain_socket, fd;
  const v1::OpenFastPathResponse opened = *server_->Open({}, Caller(), wayne);
  ASSERT_TRUE(Prove(opened, wayne_socket, fd).ok());
  const v1::OpenFastPathResponse unproven = *server_->Open({}, Caller(), wayne);
  ASSERT_TRUE(Prove(*server_->Open({}, Caller(), acme), acme_socket, fd).ok());
  ASSERT_TRUE(Prove(*server_->Open({}, Caller(), ""), plain_socket, fd).ok());
  v1::LeaseBlocksResponse response;
  ASSERT_TRUE(
      server_->Lease(opened.session_id(), "ns", kvblock::LayoutId(layout_), {hash}, absl::Minutes(5), response).ok());
  ASSERT_EQ(store_->Stats().pinned_blocks, 1u);
  ASSERT_EQ(server_->Counters().sessions, 3u);

  ca.Revoke(dir.path() / "wayne" / "tls.crt");
  const fs::path crl = dir.path() / "ca.crl";
  ca.WriteCrl(crl, absl::ToUnixSeconds(absl::Now()) - 60, absl::ToUnixSeconds(absl::Now()) + 3600);
  std::vector<Certificate> cas = PemBlocks(ca_pem, PEM_read_bio_X509);
  const RevocationLists::Version lists = *RevocationLists::Check(crl.string(), {cas.front().get()});
  {
    absl::MutexLock lock(&mu);
    in_force = *PeerTrust::Make(ca_pem, lists.lists);
  }
  EXPECT_TRUE(server_->AwaitSessions(2, absl::Seconds(5))) << "wayne's session outlived the revocation";
  EXPECT_EQ(store_->Stats().pinned_blocks, 0u) << "wayne's lease outlived its session";
  char byte;
  EXPECT_EQ(recv(wayne_socket, &byte, 1, MSG_DONTWAIT), 0) << "wayne's connection was not closed";
  int late_socket;
  EXPECT_FALSE(Prove(unproven, late_socket, fd).ok()) << "wayne's unproven session outlived the revocation";
  const absl::StatusOr<v1::OpenFastPathResponse> again = server_->Open({}, Caller(), wayne);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(again.status().message().find("CN=wayne: certificate revoked"), std::string::npos) << again.status();
  EXPECT_TRUE(server_->Open({}, Caller(), acme).ok());

  int brief_socket;
  ASSERT_TRUE(Prove(*server_->Open({}, Caller(), chain_of("brief", 3)), brief_socket, fd).ok());
  EXPECT_TRUE(server_->AwaitSessions(3, absl::Seconds(1)));
  EXPECT_TRUE(server_->AwaitSessions(2, absl::Seconds(10))) << "a session outlived its certificate";
  EXPECT_EQ(recv(acme_socket, &byte, 1, MSG_DONTWAIT), -1) << "acme's connection was closed";
  EXPECT_EQ(recv(plain_socket, &byte, 1, MSG_DONTWAIT), -1) << "a session without a certificate ended";
  close(wayne_socket), close(acme_socket), close(plain_socket), close(late_socket), close(brief_socket);
  server_.reset();  // its loop reads `in_force`, which goes with this test
}

// A session maps a segment only for a tenant that may still read the
// namespace it leased (asked again at each request: the tenants file may
// have changed since the lease).
TEST_F(FastPathServerTest, ASegmentIsMappedOnlyWhileItsTenantMayReadItsNamespace) {
  std::atomic<bool> may_read{true};
  FastPathOptions f;
  f.may_read = [&may_read](const std::string& tenant, const std::string& ns) {
    return may_read && tenant == "end-tenant" && ns == "ns";
  };
  Start(nullptr, f);
  const kvblock::BlockHash hash = PutBlock(5);
  Caller acting;  // a service leasing for its end tenant: the end tenant's right counts
  acting.tenant = "end-tenant";
  acting.service = "prefill";
  Caller service;
  service.tenant = "prefill";
  int socket, fd;
  const v1::OpenFastPathResponse opened = *server_->Open({}, service);
  ASSERT_TRUE(Prove(opened, socket, fd).ok());
  v1::LeaseBlocksResponse response;
  ASSERT_TRUE(
      server_->Lease(opened.session_id(), "ns", kvblock::LayoutId(layout_), {hash}, absl::Minutes(5), response, acting)
          .ok());
  ASSERT_TRUE(response.blocks(0).has_shared());
  const v1::SharedPiece& piece = response.blocks(0).shared().pieces(0);
  fastpath::Request request{fastpath::RequestKind::kSegment};
  request.tier = piece.tier_index();
  request.segment = piece.segment();
  request.generation = piece.generation();
  const auto ask = [&] {
    EXPECT_TRUE(fastpath::SendRequest(socket, request).ok());
    int segment = -1;
    const absl::Status answer = fastpath::ReceiveReply(socket, segment);
    if (segment >= 0) close(segment);
    return answer.code();
  };
  EXPECT_EQ(ask(), absl::StatusCode::kOk);
  may_read = false;
  EXPECT_EQ(ask(), absl::StatusCode::kPermissionDenied);
  close(socket);
}

// Stop (before a cache moves its memory tiers to disk at exit): leases
// end, their blocks unpinned, the socket takes no connection, the counters
// stay readable, and a second Stop (the destructor's) does nothing.
TEST_F(FastPathServerTest, StopEndsLeasesAndListening) {
  const kvblock::BlockHash hash = PutBlock(3);
  int socket;
  const uint64_t session = Proven(socket);
  v1::LeaseBlocksResponse response;
  ASSERT_TRUE(server_->Lease(session, "ns", kvblock::LayoutId(layout_), {hash}, absl::Minutes(5), response).ok());
  ASSERT_EQ(store_->Stats().pinned_blocks, 1u);
  server_->Stop();
  EXPECT_EQ(store_->Stats().pinned_blocks, 0u);
  EXPECT_EQ(server_->Counters().sessions, 0u);
  EXPECT_EQ(server_->Counters().blocks_out, 1u);
  EXPECT_FALSE(fastpath::Connect(server_->socket_path()).ok());
  close(socket);
  server_->Stop();
}

// Sessions that never prove themselves (opened from another host, say)
// hold none of the staging budget: a proven session gets its region.
TEST_F(FastPathServerTest, StagingGoesOnlyToProvenSessions) {
  v1::OpenFastPathRequest wants;
  wants.set_staging_bytes(64 << 20);
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(server_->Open(wants).ok());  // never proven
  EXPECT_EQ(server_->Counters().staging_bytes, 0u);
  int socket, fd = -1;
  ASSERT_TRUE(Prove(*server_->Open(wants), socket, fd).ok());
  ASSERT_GE(fd, 0) << "the proven session got no staging region";
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 64u << 20);
  EXPECT_EQ(server_->Counters().staging_bytes, 64u << 20);
  close(fd);
  close(socket);
}

// Likewise GPU memory: with the device tier on a GPU (a host stand-in that
// exports buffers as a GPU does), a session's own device buffer is made
// when it proves itself, within the device staging budget; its handle comes
// over the socket only; a lease copies the GPU tier's blocks into it; it is
// freed with the session.
TEST_F(FastPathServerTest, DeviceStagingGoesOnlyToProvenSessions) {
  auto slab = std::make_shared<RecordingSlab>(64 * 4096);
  FastPathOptions f;
  f.max_device_staging = 2 << 20;
  f.device_staging_budget = 3 << 20;
  Start(slab, f);
  const kvblock::BlockHash hash = PutBlock(7);
  v1::OpenFastPathRequest wants;
  wants.set_device_staging_bytes(64 << 20);
  std::vector<v1::OpenFastPathResponse> opened;
  for (int i = 0; i < 16; ++i) {
    opened.push_back(*server_->Open(wants));
    EXPECT_EQ(opened.back().device_staging_bytes(), 2u << 20) << "offered: the session's most";
  }
  EXPECT_TRUE(slab->exported.empty()) << "GPU memory exported to sessions that never proved themselves";
  EXPECT_EQ(server_->Counters().device_staging_bytes, 0u);

  int first, fd;
  fastpath::DeviceGrant grant;
  ASSERT_TRUE(Prove(opened[0], first, fd, &grant).ok());
  ASSERT_EQ(slab->exported.size(), 1u);
  EXPECT_EQ(grant.bytes, 2u << 20);
  EXPECT_EQ(std::string(grant.ipc_handle.data(), grant.ipc_handle.size()), slab->exported[0]->handle());
  EXPECT_EQ(server_->Counters().device_staging_bytes, 2u << 20);
  // The GPU tier's block, copied into the session's buffer for its lease.
  v1::LeaseBlocksResponse leased;
  ASSERT_TRUE(
      server_->Lease(opened[0].session_id(), "ns", kvblock::LayoutId(layout_), {hash}, absl::Seconds(5), leased).ok());
  ASSERT_TRUE(leased.blocks(0).has_device()) << leased.blocks(0).DebugString();
  const std::string record = (*store_->Read("ns", kvblock::LayoutId(layout_), hash))->CopyToString();
  EXPECT_EQ(slab->exported[0]->bytes().substr(leased.blocks(0).device().offset(), leased.blocks(0).device().size()),
            record);

  // The second proven session gets what is left of the budget, the third none.
  int second, third;
  ASSERT_TRUE(Prove(opened[1], second, fd, &grant).ok());
  EXPECT_EQ(grant.bytes, 1u << 20);
  ASSERT_EQ(slab->exported.size(), 2u);
  EXPECT_EQ(std::string(grant.ipc_handle.data(), grant.ipc_handle.size()), slab->exported[1]->handle());
  ASSERT_TRUE(Prove(opened[2], third, fd, &grant).ok());
  EXPECT_EQ(grant.bytes, 0u);
  EXPECT_EQ(slab->exported.size(), 2u) << "nothing exported when the budget is spent";
  EXPECT_EQ(server_->Counters().device_staging_bytes, 3u << 20);
  // A session that ends gives its buffer back.
  close(first);
  ASSERT_TRUE(server_->AwaitSessions(2, absl::Seconds(5)));
  EXPECT_EQ(server_->Counters().device_staging_bytes, 1u << 20);
  EXPECT_EQ(slab->live_exports->load(), 1);
  close(second), close(third);
}

// A lease's GPU tier blocks, of several pages each, reach the session's
// device staging in one batch of copies (a GPU waits once a lease, not once
// a page), runs that follow each other on both sides as one, and land
// whole.
TEST_F(FastPathServerTest, ALeaseCopiesItsGpuTierBlocksInOneBatch) {
  auto slab = std::make_shared<RecordingSlab>(64 * 4096);
  Start(slab, FastPathOptions());
  layout_.kv_lora_rank = 512;  // records of several 4 KiB pages
  layout_.rope_dim = 64;
  const std::vector<kvblock::BlockHash> hashes = {PutBlock(1), PutBlock(2), PutBlock(3)};
  const size_t record_bytes = (*store_->Read("ns", kvblock::LayoutId(layout_), hashes[0]))->size();
  v1::OpenFastPathRequest wants;
  wants.set_device_staging_bytes(4 * record_bytes);  // room for one lease of the three
  const v1::OpenFastPathResponse opened = *server_->Open(wants);
  int socket, fd;
  fastpath::DeviceGrant grant;
  ASSERT_TRUE(Prove(opened, socket, fd, &grant).ok());
  ASSERT_EQ(slab->exported.size(), 1u);
  v1::LeaseBlocksResponse leased;
  ASSERT_TRUE(
      server_->Lease(opened.session_id(), "ns", kvblock::LayoutId(layout_), hashes, absl::Seconds(5), leased).ok());
  ASSERT_EQ(slab->export_batches.size(), 1u) << "one batch of copies a lease";
  const std::vector<ExportRun>& batch = slab->export_batches[0];
  size_t records_bytes = 0, copied = 0;
  for (size_t k = 0; k < hashes.size(); ++k) {
    ASSERT_TRUE(leased.blocks(k).has_device()) << leased.blocks(k).DebugString();
    const std::string record = (*store_->Read("ns", kvblock::LayoutId(layout_), hashes[k]))->CopyToString();
    ASSERT_GT(record.size(), 2 * 4096u);
    EXPECT_EQ(slab->exported[0]->bytes().substr(leased.blocks(k).device().offset(), leased.blocks(k).device().size()),
              record);
    records_bytes += record.size();
  }
  for (size_t r = 0; r < batch.size(); ++r) {
    copied += batch[r].n;
    if (r > 0) {
      EXPECT_FALSE(batch[r - 1].offset + batch[r - 1].n == batch[r].offset &&
                   batch[r - 1].to_offset + batch[r - 1].n == batch[r].to_offset)
          << "runs that follow each other not merged";
    }
  }
  EXPECT_EQ(copied, records_bytes);
  // A batch that fails: its blocks are answered UNAVAILABLE (read with
  // Get) and their staging is free again (the next lease finds room).
  ASSERT_TRUE(server_->Release(leased.lease_id()).ok());
  slab->refuse_exports = true;
  v1::LeaseBlocksResponse refused;
  ASSERT_TRUE(
      server_->Lease(opened.session_id(), "ns", kvblock::LayoutId(layout_), hashes, absl::Seconds(5), refused).ok());
  for (const v1::LeasedBlock& b : refused.blocks()) {
    EXPECT_EQ(b.miss().code(), static_cast<int>(absl::StatusCode::kUnavailable)) << b.DebugString();
  }
  EXPECT_EQ(refused.lease_id(), 0u) << "a lease of nothing";
  slab->refuse_exports = false;
  v1::LeaseBlocksResponse again;
  ASSERT_TRUE(
      server_->Lease(opened.session_id(), "ns", kvblock::LayoutId(layout_), hashes, absl::Seconds(5), again).ok());
  for (const v1::LeasedBlock& b : again.blocks()) EXPECT_TRUE(b.has_device()) << b.DebugString();
  close(socket);
}

TEST_F(FastPathServerTest, UnprovenSessionsAndSilentConnectionsAreDropped) {
  v1::OpenFastPathResponse opened = *server_->Open(v1::OpenFastPathRequest());
  const int silent = *fastpath::Connect(opened.socket_path());
  // A proof over a later connection: the server accepts connections in
  // order, so once it answers, the silent one was accepted (at this time).
  int proven;
  Proven(proven);
  clock_.Advance(absl::Seconds(10));
  // The session is gone: its hello is refused.
  int late, fd;
  EXPECT_EQ(Prove(opened, late, fd).code(), absl::StatusCode::kPermissionDenied);
  // The connection that never spoke is closed by the server (within a poll
  // period; the receive times out after 5 s otherwise).
  EXPECT_NE(fastpath::ReceiveReply(silent, fd).message().find("closed"), std::string::npos);
  close(silent), close(late), close(proven);
}

// A local process holding many idle connections (of its uid, as here)
// keeps no one out: the oldest unproven connections make room, proven
// ones stay.
TEST_F(FastPathServerTest, IdleConnectionsMakeRoomAndNeverKeepAProofOut) {
  FastPathOptions f;
  f.max_sessions = 16;  // 32 connections in all
  f.max_unproven_per_uid = 8;
  Start(nullptr, f);
  int first;
  Proven(first);
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(*fastpath::Connect(server_->socket_path()));
  for (int i = 0; i < 3; ++i) {
    int socket;
    Proven(socket);
    close(socket);
  }
  EXPECT_TRUE(server_->AwaitSessions(1, absl::Seconds(5))) << "the first proven session was closed";
  // The server closed all but the newest unproven ones of this uid.
  int closed = 0;
  for (int fd : idle) {
    pollfd p{fd, POLLIN, 0};
    char byte;
    closed += poll(&p, 1, 100) == 1 && recv(fd, &byte, 1, 0) == 0;
    close(fd);
  }
  EXPECT_GE(closed, 100 - 8);
  close(first);
}

TEST_F(FastPathServerTest, ClientsOnAnotherHostAreRefusedBeforeAnySession) {
  ASSERT_FALSE(fastpath::HostBootId().empty()) << "/proc/sys/kernel/random/boot_id";
  v1::OpenFastPathRequest elsewhere;
  elsewhere.set_host_boot_id("00000000-0000-0000-0000-000000000000");
  EXPECT_EQ(server_->Open(elsewhere).status().code(), absl::StatusCode::kFailedPrecondition);
  v1::OpenFastPathRequest here;
  here.set_host_boot_id(fastpath::HostBootId());
  EXPECT_TRUE(server_->Open(here).ok());
}

}  // namespace
}  // namespace kvtier::cache
