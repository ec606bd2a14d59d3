// The bulk stream as users run it: the real kvtier-cache on port 0 with
// --bulk-listen 127.0.0.1:0, blocks stored over gRPC, read back over the
// stream with BulkClient, and raw sockets for what BulkClient never sends.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "services/cache/bulk_client.h"
#include "services/cache/bulk_stream.h"
#include "services/cache/cache_client.h"
#include "services/common/child_process.h"
#include "services/serving/shard_set.h"
#include "tests/integration/cache_test_blocks.h"
#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

using kvblock::BlockHash;

class BulkStreamTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {KVTIER_CACHE_BINARY, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                                     "--device-capacity", "64MiB", "--host-capacity", "64MiB",
                                     "--bulk-listen", "127.0.0.1:0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    server_ = std::make_unique<ChildProcess>(std::move(argv));
    const std::optional<std::string> metrics = server_->WaitForLine("metrics on ");
    ASSERT_TRUE(metrics.has_value());
    metrics_address_ = metrics->substr(0, metrics->find('/'));
    const int port = server_->WaitForListeningPort();
    ASSERT_GT(port, 0);
    target_ = "127.0.0.1:" + std::to_string(port);
    client_ = std::make_unique<CacheClient>(CacheClient::Connect(target_));
    auto stats = client_->Stats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_GT(stats->bulk_port(), 0u);
    bulk_address_ = "127.0.0.1:" + std::to_string(stats->bulk_port());
  }
  void SetUp() override { Start(); }

  // Stores `n` blocks of fresh random content in `ns`.
  std::vector<TestBlock> Store(const std::string& ns, int n) {
    return StoreBlocks(*client_, layout_, ns, rng_.engine()(), n);
  }

  // A request's answers, each record in a buffer of its own.
  struct Answers {
    absl::Status status;
    std::vector<RawBlock> blocks;
    std::map<uint32_t, std::string> records;
  };
  static Answers Run(BulkClient& client, const v1::GetRequest& request) {
    Answers a;
    a.status = client.Get(
        request,
        [&](uint32_t index, size_t size) {
          std::string& r = a.records[index];
          r.resize(size);
          return std::span<uint8_t>(reinterpret_cast<uint8_t*>(r.data()), r.size());
        },
        [&](const RawBlock& b) { a.blocks.push_back(b); });
    return a;
  }

  // A connected socket to the bulk stream, for bytes BulkClient never sends.
  int RawSocket() const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(std::stoi(bulk_address_.substr(bulk_address_.rfind(':') + 1))));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_TRUE(bulk::ConfigureSocket(fd, absl::Seconds(30)).ok());
    return fd;
  }
  static absl::Status Send(int fd, std::string_view bytes) {
    iovec piece{const_cast<char*>(bytes.data()), bytes.size()};
    return bulk::SendAll(fd, {&piece, 1});
  }
  static std::string Head(const bulk::RequestHead& head) {
    return std::string(reinterpret_cast<const char*>(&head), sizeof head);
  }
  // The end frame's status that answers what was sent on `fd`; `closing`
  // (if given) says whether the frame said the cache closes the connection.
  static absl::Status ReadEnd(int fd, bool* closing = nullptr) {
    bulk::Frame frame;
    if (absl::Status s = bulk::ReceiveAll(fd, {reinterpret_cast<uint8_t*>(&frame), sizeof frame}); !s.ok()) return s;
    EXPECT_EQ(frame.index, bulk::kBulkEndIndex);
    if (closing != nullptr) *closing = frame.tier == bulk::kClosing;
    std::string message(frame.length, '\0');
    EXPECT_TRUE(bulk::ReceiveAll(fd, {reinterpret_cast<uint8_t*>(message.data()), message.size()}).ok());
    return absl::Status(static_cast<absl::StatusCode>(frame.code), message);
  }

  kvblock::LatentLayout layout_ = TestLayout();
  std::unique_ptr<ChildProcess> server_;
  std::unique_ptr<CacheClient> client_;
  std::string target_, metrics_address_, bulk_address_;
  testing::SeededRng rng_;
};

TEST_F(BulkStreamTest, ReadsBackEveryByteAndSaysWhatMissed) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<TestBlock> blocks = Store("ns", 12);
  std::vector<BlockHash> hashes = Hashes(blocks);
  const BlockHash absent = MakeBlock(layout_, "ns", rng_.engine()()).slices.hash;
  hashes.insert(hashes.begin() + 5, absent);

  auto client = BulkClient::Connect(bulk_address_);
  ASSERT_TRUE(client.ok()) << client.status();
  const Answers a = Run(**client, MakeGetRequest("ns", layout_, hashes));
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_EQ(a.blocks.size(), hashes.size());
  for (uint32_t i = 0; i < hashes.size(); ++i) {
    EXPECT_EQ(a.blocks[i].index, i);
    if (i == 5) {
      EXPECT_EQ(a.blocks[i].status.code(), absl::StatusCode::kNotFound) << a.blocks[i].status;
      continue;
    }
    ASSERT_TRUE(a.blocks[i].status.ok()) << i << ": " << a.blocks[i].status;
    EXPECT_EQ(a.blocks[i].tier, v1::TIER_DEVICE);
    EXPECT_EQ(a.records.at(i), blocks[i < 5 ? i : i - 1].record) << i;
  }

  // The same connection again, for a layer subset: the record gRPC's Get
  // answers for the same request.
  v1::GetRequest subset = MakeGetRequest("ns", layout_, {hashes[0], hashes[7]});
  subset.set_layer_begin(2);
  subset.set_layer_count(3);
  const Answers b = Run(**client, subset);
  ASSERT_TRUE(b.status.ok()) << b.status;
  auto via_grpc = client_->Get("ns", layout_, {hashes[0], hashes[7]});
  ASSERT_TRUE(via_grpc.ok());
  grpc::ClientContext context;
  client_->SetDeadline(context);
  auto reader = client_->stub().Get(&context, subset);
  v1::GetResponse response;
  for (uint32_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(reader->Read(&response));
    EXPECT_EQ(b.records.at(i), response.data()) << i;
    EXPECT_LT(b.records.at(i).size(), blocks[0].record.size());
  }
  EXPECT_TRUE(reader->Finish().ok());

  auto stats = client_->Stats();
  EXPECT_EQ(stats->bulk_connections(), 1u);
  EXPECT_EQ(stats->pinned_blocks(), 0u);
}

TEST_F(BulkStreamTest, ShardSetReadsRemoteShardsOverIt) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<TestBlock> blocks = Store("ns", 6);
  const std::vector<BlockHash> hashes = Hashes(blocks);
  // Without the fast path, as a worker on another host reads the shard.
  auto shards = serving::ShardSet::Create(target_, absl::Seconds(10), /*fast_path=*/false);
  ASSERT_TRUE(shards.ok());
  for (int pass = 0; pass < 2; ++pass) {
    const auto fetched = (*shards)->Fetch("ns", layout_, hashes);
    ASSERT_EQ(fetched.size(), hashes.size());
    for (size_t i = 0; i < hashes.size(); ++i) {
      ASSERT_TRUE(fetched[i].ok()) << i << ": " << fetched[i].status();
      EXPECT_EQ(**fetched[i], blocks[i].record) << i;
    }
    // It came over the bulk stream, whose connection is kept for the next
    // Fetch (the second pass reuses it).
    EXPECT_EQ(client_->Stats()->bulk_connections(), 1u);
  }
  // What an operator sees of it.
  const std::string port = bulk_address_.substr(bulk_address_.rfind(':') + 1);
  const CommandResult table = RunCommand(std::string(KVTIER_BINARY) + " stats --target " + target_);
  EXPECT_NE(table.output.find("bulk stream: port " + port + ", 1 connections"), std::string::npos) << table.output;
  const CommandResult json = RunCommand(std::string(KVTIER_BINARY) + " stats --json --target " + target_);
  EXPECT_NE(json.output.find("\"bulk_port\": " + port + ", \"bulk_connections\": 1}"), std::string::npos)
      << json.output;
  const CommandResult scrape = RunCommand("curl -sf http://" + metrics_address_ + "/metrics");
  EXPECT_NE(scrape.output.find("kvtier_cache_bulk_connections 1\n"), std::string::npos) << scrape.output;
  EXPECT_NE(scrape.output.find("kvtier_cache_rpc_duration_seconds_count{code=\"OK\",method=\"BulkGet\"} 2\n"),
            std::string::npos)
      << scrape.output;
}

TEST_F(BulkStreamTest, ShardSetFallsBackToGetWhenTheBulkStreamIsFull) {
  server_.reset();
  Start({"--bulk-max-connections", "1"});
  const std::vector<TestBlock> blocks = Store("ns", 3);
  const std::vector<BlockHash> hashes = Hashes(blocks);
  auto holder = BulkClient::Connect(bulk_address_);  // takes the one place
  ASSERT_TRUE(holder.ok());
  ASSERT_TRUE(Run(**holder, MakeGetRequest("ns", layout_, {})).status.ok());
  auto shards = serving::ShardSet::Create(target_, absl::Seconds(10), /*fast_path=*/false);
  ASSERT_TRUE(shards.ok());
  const auto fetched = (*shards)->Fetch("ns", layout_, hashes);
  for (size_t i = 0; i < hashes.size(); ++i) {
    ASSERT_TRUE(fetched[i].ok()) << i << ": " << fetched[i].status();
    EXPECT_EQ(**fetched[i], blocks[i].record) << i;
  }
  EXPECT_EQ(client_->Stats()->bulk_connections(), 1u);  // only the holder's
}

TEST_F(BulkStreamTest, RefusedRequestsGetTheirStatusAndTheConnectionGoesOn) {
  server_.reset();
  Start({"--namespaces", "ns,other"});
  const std::vector<TestBlock> blocks = Store("ns", 2);
  const std::vector<BlockHash> hashes = {blocks[0].slices.hash, blocks[1].slices.hash};
  struct Case {
    std::string what;
    v1::GetRequest request;
    absl::StatusCode code;
  };
  std::vector<Case> cases;
  cases.push_back({"unknown namespace", MakeGetRequest("stranger", layout_, hashes), absl::StatusCode::kNotFound});
  cases.push_back({"malformed namespace", MakeGetRequest("a/b", layout_, hashes), absl::StatusCode::kInvalidArgument});
  v1::GetRequest layers = MakeGetRequest("ns", layout_, hashes);
  layers.set_layer_begin(6);
  layers.set_layer_count(3);  // of 8
  cases.push_back({"layers outside the layout", layers, absl::StatusCode::kInvalidArgument});
  v1::GetRequest layout = MakeGetRequest("ns", layout_, hashes);
  layout.mutable_layout()->set_num_layers(0);
  cases.push_back({"layout without layers", layout, absl::StatusCode::kInvalidArgument});
  v1::GetRequest hash = MakeGetRequest("ns", layout_, hashes);
  hash.set_block_hashes(1, "short");
  cases.push_back({"5-byte block hash", hash, absl::StatusCode::kInvalidArgument});
  v1::GetRequest many = MakeGetRequest("ns", layout_, {});
  for (int i = 0; i < 65537; ++i) many.add_block_hashes(std::string(kvblock::HashAsBytes(hashes[0])));
  cases.push_back({"65,537 blocks", many, absl::StatusCode::kInvalidArgument});

  auto client = BulkClient::Connect(bulk_address_);
  ASSERT_TRUE(client.ok());
  for (const Case& c : cases) {
    const Answers refused = Run(**client, c.request);
    EXPECT_EQ(refused.status.code(), c.code) << c.what << ": " << refused.status;
    EXPECT_TRUE(refused.blocks.empty()) << c.what;
    EXPECT_FALSE((*client)->broken()) << c.what;
    // Nothing lost: the next request on the connection is answered.
    const Answers ok = Run(**client, MakeGetRequest("ns", layout_, hashes));
    ASSERT_TRUE(ok.status.ok()) << c.what << ": " << ok.status;
    EXPECT_EQ(ok.records.at(1), blocks[1].record) << c.what;
  }

  // A body that is not a GetRequest: refused, and the connection goes on.
  const int fd = RawSocket();
  const std::string garbage = "\xff\xff\xff\xff not protobuf";
  ASSERT_TRUE(Send(fd, Head({bulk::kBulkRequestMagic, static_cast<uint32_t>(garbage.size())}) + garbage).ok());
  bool closing = true;
  EXPECT_EQ(ReadEnd(fd, &closing).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(closing);
  // An empty GetRequest: no namespace.
  ASSERT_TRUE(Send(fd, Head({bulk::kBulkRequestMagic, 0})).ok());
  EXPECT_EQ(ReadEnd(fd).code(), absl::StatusCode::kInvalidArgument);
  close(fd);
}

TEST_F(BulkStreamTest, UnreadableRequestsEndTheConnection) {
  struct Case {
    std::string what;
    bulk::RequestHead head;
  };
  for (const Case& c : {Case{"wrong magic", {0x50545448, 4}},  // "HTTP"
                        Case{"request over 4 MiB", {bulk::kBulkRequestMagic, bulk::kMaxBulkRequestBytes + 1}}}) {
    const int fd = RawSocket();
    ASSERT_TRUE(Send(fd, Head(c.head)).ok()) << c.what;
    bool closing = false;
    EXPECT_EQ(ReadEnd(fd, &closing).code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_TRUE(closing) << c.what;
    uint8_t byte;
    EXPECT_EQ(recv(fd, &byte, 1, 0), 0) << c.what << ": the cache closes the connection";
    close(fd);
  }
  // The server is still there for others.
  auto client = BulkClient::Connect(bulk_address_);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(Run(**client, MakeGetRequest("ns", layout_, {})).status.ok());
}

TEST_F(BulkStreamTest, RandomBytesGetAnAnswerOrACloseAndNeverACrash) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<TestBlock> blocks = Store("ns", 2);
  const std::string valid = MakeGetRequest("ns", layout_, {blocks[0].slices.hash, blocks[1].slices.hash})
                                .SerializeAsString();
  std::uniform_int_distribution<int> byte(0, 255), kind(0, 2);
  for (int i = 0; i < 200; ++i) {
    // Random heads, or the right magic with a random body, or a valid
    // request with bytes flipped: each is answered or the connection closed.
    std::string bytes;
    const int k = kind(rng_.engine());
    if (k == 0) {
      bytes.resize(1 + rng_.engine()() % 64);
      for (char& c : bytes) c = static_cast<char>(byte(rng_.engine()));
    } else {
      std::string body = valid;
      if (k == 1) body.resize(rng_.engine()() % 256);
      for (char& c : body) {
        if (k == 1 || rng_.engine()() % 16 == 0) c = static_cast<char>(byte(rng_.engine()));
      }
      bytes = Head({bulk::kBulkRequestMagic, static_cast<uint32_t>(body.size())}) + body;
    }
    const int fd = RawSocket();
    ASSERT_TRUE(Send(fd, bytes).ok()) << i;
    shutdown(fd, SHUT_WR);  // a short head then reads as a closed connection
    // Whatever comes back (frames, then an end frame) ends with the cache
    // closing the connection, not resetting it.
    char sink[65536];
    ssize_t n;
    while ((n = recv(fd, sink, sizeof sink, 0)) > 0) {
    }
    EXPECT_EQ(n, 0) << i << ": " << std::strerror(errno);
    close(fd);
  }
  auto client = BulkClient::Connect(bulk_address_);
  ASSERT_TRUE(client.ok());
  const Answers a = Run(**client, MakeGetRequest("ns", layout_, {blocks[1].slices.hash}));
  ASSERT_TRUE(a.status.ok()) << a.status;
  EXPECT_EQ(a.records.at(0), blocks[1].record);
  EXPECT_TRUE(StatsEventually(*client_, [](const v1::StatsResponse& s) { return s.pinned_blocks() == 0; }));
}

TEST_F(BulkStreamTest, ReaderThatVanishesLeavesNothingPinnedOrLeased) {
  const std::vector<TestBlock> blocks = Store("ns", 24);
  const std::vector<BlockHash> hashes = Hashes(blocks);
  auto lease = client_->Match("ns", layout_, hashes, /*acquire_lease=*/true, 600000);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(client_->Stats()->pinned_blocks(), 24u);
  {
    auto client = BulkClient::Connect(bulk_address_);
    ASSERT_TRUE(client.ok());
    // Stops after the first block, as a reader that dies: the connection
    // closes with 23 blocks unsent (more than the socket buffers hold).
    size_t seen = 0;
    const absl::Status status = (*client)->Get(
        MakeGetRequest("ns", layout_, hashes, lease->lease_id()),
        [&](uint32_t, size_t size) -> std::span<uint8_t> {
          static std::string sink;
          sink.resize(size);
          return {reinterpret_cast<uint8_t*>(sink.data()), seen++ == 0 ? size : 0};
        },
        [](const RawBlock&) {});
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;  // no room: it gave up
    EXPECT_TRUE((*client)->broken());
  }
  EXPECT_TRUE(StatsEventually(*client_, [](const v1::StatsResponse& s) {
    return s.pinned_blocks() == 0 && s.active_leases() == 0 && s.bulk_connections() == 0;
  }));
}

TEST_F(BulkStreamTest, ConnectionsBeyondTheLimitAreRefused) {
  server_.reset();
  Start({"--bulk-max-connections", "1"});
  Store("ns", 1);
  auto first = BulkClient::Connect(bulk_address_);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(Run(**first, MakeGetRequest("ns", layout_, {})).status.ok());  // accepted and served
  auto second = BulkClient::Connect(bulk_address_);
  ASSERT_TRUE(second.ok());  // the kernel accepts; the cache answers and closes
  const Answers refused = Run(**second, MakeGetRequest("ns", layout_, {}));
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted) << refused.status;
  EXPECT_TRUE((*second)->broken());
  first->reset();  // its connection closes, which frees the place
  EXPECT_TRUE(StatsEventually(*client_, [](const v1::StatsResponse& s) { return s.bulk_connections() == 0; }));
  auto third = BulkClient::Connect(bulk_address_);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(Run(**third, MakeGetRequest("ns", layout_, {})).status.ok());
}

TEST_F(BulkStreamTest, SigtermLetsAnInFlightRequestFinish) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<TestBlock> blocks = Store("ns", 48);
  const std::vector<BlockHash> hashes = Hashes(blocks);
  auto idle = BulkClient::Connect(bulk_address_);  // closed by the cache at SIGTERM
  ASSERT_TRUE(idle.ok());
  auto client = BulkClient::Connect(bulk_address_);
  ASSERT_TRUE(client.ok());
  Answers a;
  a.status = (*client)->Get(
      MakeGetRequest("ns", layout_, hashes),
      [&](uint32_t index, size_t size) {
        std::string& r = a.records[index];
        r.resize(size);
        return std::span<uint8_t>(reinterpret_cast<uint8_t*>(r.data()), r.size());
      },
      [&](const RawBlock& b) {
        if (a.blocks.empty()) {
          EXPECT_EQ(kill(server_->pid(), SIGTERM), 0);  // 47 blocks still to come
        }
        a.blocks.push_back(b);
      });
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_EQ(a.blocks.size(), hashes.size());
  for (uint32_t i = 0; i < hashes.size(); ++i) EXPECT_EQ(a.records.at(i), blocks[i].record) << i;
  EXPECT_EQ(server_->Stop(SIGTERM), 0);
  EXPECT_FALSE(Run(**idle, MakeGetRequest("ns", layout_, {})).status.ok());
}

TEST(BulkClientConnect, SaysWhyAnAddressCannotBeUsed) {
  EXPECT_EQ(BulkClient::Connect("nowhere").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BulkClient::Connect(":7072").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BulkClient::Connect("127.0.0.1:").status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status closed = BulkClient::Connect("127.0.0.1:1").status();  // nothing listens there
  EXPECT_EQ(closed.code(), absl::StatusCode::kUnavailable) << closed;
  EXPECT_NE(closed.message().find("127.0.0.1:1"), std::string::npos) << closed;
}

}  // namespace
}  // namespace kvtier::cache
