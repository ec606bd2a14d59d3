// FastPathServer with a hand-driven clock: unproven sessions and silent
// connections are dropped after prove_within, leases end at their deadline
// and when the session's socket closes.
#include "services/cache/fast_path/fast_path_server.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>

#include "services/cache/fast_path/fast_path_socket.h"
#include "services/kvblock/block_format.h"
#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

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
  void SetUp() override {
    StoreOptions o;
    o.page_size = 4096;
    o.device_capacity = o.host_capacity = 64 * 4096;
    o.shared_memory = true;
    store_ = *BlockStore::Create(o, &clock_);
    FastPathOptions f;
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

  // Opens and proves a session; returns its id and keeps its socket in `socket`.
  uint64_t Proven(int& socket) {
    v1::OpenFastPathResponse opened = *server_->Open(v1::OpenFastPathRequest());
    socket = *fastpath::Connect(opened.socket_path());
    fastpath::Request hello{fastpath::RequestKind::kHello};
    hello.session_id = opened.session_id();
    std::memcpy(hello.secret.data(), opened.secret().data(), 16);
    int fd;
    EXPECT_TRUE(fastpath::SendRequest(socket, hello).ok());
    EXPECT_TRUE(fastpath::ReceiveReply(socket, fd).ok());
    return opened.session_id();
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

// Sessions that never prove themselves (opened from another host, say)
// hold none of the staging budget: a proven session gets its region.
TEST_F(FastPathServerTest, StagingGoesOnlyToProvenSessions) {
  v1::OpenFastPathRequest wants;
  wants.set_staging_bytes(64 << 20);
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(server_->Open(wants).ok());  // never proven
  EXPECT_EQ(server_->Counters().staging_bytes, 0u);
  v1::OpenFastPathResponse opened = *server_->Open(wants);
  const int socket = *fastpath::Connect(opened.socket_path());
  fastpath::Request hello{fastpath::RequestKind::kHello};
  hello.session_id = opened.session_id();
  std::memcpy(hello.secret.data(), opened.secret().data(), 16);
  int fd = -1;
  ASSERT_TRUE(fastpath::SendRequest(socket, hello).ok());
  ASSERT_TRUE(fastpath::ReceiveReply(socket, fd).ok());
  ASSERT_GE(fd, 0) << "the proven session got no staging region";
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 64u << 20);
  EXPECT_EQ(server_->Counters().staging_bytes, 64u << 20);
  close(fd);
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
  const int late = *fastpath::Connect(opened.socket_path());
  fastpath::Request hello{fastpath::RequestKind::kHello};
  hello.session_id = opened.session_id();
  std::memcpy(hello.secret.data(), opened.secret().data(), 16);
  int fd;
  ASSERT_TRUE(fastpath::SendRequest(late, hello).ok());
  EXPECT_EQ(fastpath::ReceiveReply(late, fd).code(), absl::StatusCode::kPermissionDenied);
  // The connection that never spoke is closed by the server (within a poll
  // period; the receive times out after 5 s otherwise).
  EXPECT_NE(fastpath::ReceiveReply(silent, fd).message().find("closed"), std::string::npos);
  close(silent), close(late), close(proven);
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
