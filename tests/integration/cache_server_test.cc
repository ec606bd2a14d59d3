// kvtier-cache as users run it: the real binary on port 0, real gRPC clients.
// Over 600 lines: one fixture (a running cache) for everything its RPCs do.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "kvtier/v1/prefill.grpc.pb.h"
#include "services/base/child_process.h"
#include "services/base/metrics_page.h"
#include "services/cache/client/cache_client.h"
#include "services/cache/client/health_check.h"
#include "services/cache/client/raw_get.h"
#include "services/cache/client/shard_set.h"
#include "services/kvblock/block_format.h"
#include "services/rpc/client_identity.h"
#include "tests/integration/cache_test_blocks.h"
#include "tests/integration/list_services.h"
#include "tests/test_random.h"
#include "tests/v4_records.h"

namespace kvtier::cache {
namespace {

using kvblock::BlockHash;

class CacheServerTest : public ::testing::Test {
 protected:
  void Start(const std::string& device, const std::string& host, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {KVTIER_CACHE_BINARY,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--metrics-listen",
                                     "127.0.0.1:0",
                                     "--device-capacity",
                                     device,
                                     "--host-capacity",
                                     host,
                                     "--threads",
                                     "4"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    server_ = std::make_unique<ChildProcess>(std::move(argv));
    std::optional<std::string> metrics = server_->WaitForLine("metrics on ");
    ASSERT_TRUE(metrics.has_value());
    metrics_address_ = metrics->substr(0, metrics->find('/'));
    const int port = server_->WaitForListeningPort();
    ASSERT_GT(port, 0);
    target_ = "127.0.0.1:" + std::to_string(port);
    channel_ = MakeChannel(target_);
    client_ = std::make_unique<CacheClient>(channel_);
  }
  void SetUp() override { Start("64MiB", "128MiB"); }
  // Stops the server by SIGTERM after closing the client's connection: an
  // idle client reads the stop's GOAWAY only at gRPC's next backup poll
  // (every 5 s), and the stop waits for it.
  int StopAfterTheClient() {
    client_.reset();
    channel_.reset();
    return server_->Stop(SIGTERM);
  }

  kvblock::LatentLayout layout_ = TestLayout();
  std::unique_ptr<ChildProcess> server_;
  std::string target_, metrics_address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<CacheClient> client_;
  testing::SeededRng rng_;
};

// Without --metrics-listen the cache serves metrics on --listen's host,
// never on every interface when gRPC is on one.
TEST(CacheServerMetrics, FollowListensHostByDefault) {
  ChildProcess cache(
      {KVTIER_CACHE_BINARY, "--listen", "127.0.0.2:0", "--device-capacity", "16MiB", "--host-capacity", "16MiB"});
  const std::optional<std::string> metrics = cache.WaitForLine("metrics on ");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(metrics->substr(0, metrics->find('/')), "127.0.0.2:9464");
  EXPECT_NE(ScrapeMetrics("127.0.0.2:9464").find("kvtier_cache_"), std::string::npos);
}

// A call meant for another service says which server answered, where
// gRPC's own UNIMPLEMENTED has no message.
TEST_F(CacheServerTest, ACallToAnotherServiceSaysWhatAnswered) {
  auto prefill = v1::Prefill::NewStub(channel_);
  grpc::ClientContext context;
  v1::GenerateRequest request;
  request.add_prompt_token_ids(1);
  auto reader = prefill->Generate(&context, request);
  v1::GenerateResponse ignored;
  while (reader->Read(&ignored)) {
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(status.error_message(),
            "/kvtier.v1.Prefill/Generate is not served here: this is kvtier-cache, which serves kvtier.v1.KvCache");
}

TEST_F(CacheServerTest, SixteenClientsReadBackEveryByteTheyWrote) {
  SCOPED_TRACE(rng_.Trace());
  constexpr int kClients = 16, kBlocksEach = 6;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  const uint64_t base = rng_.seed();
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      CacheClient client(MakeChannel(target_));
      const std::string ns = "tenant-" + std::to_string(c % 4);
      std::vector<TestBlock> blocks;
      std::vector<BlockSlices> slices;
      std::vector<BlockHash> hashes;
      for (int i = 0; i < kBlocksEach; ++i) {
        blocks.push_back(MakeBlock(layout_, ns, base + c * 1000 + i));
        slices.push_back(blocks.back().slices);
        hashes.push_back(blocks.back().slices.hash);
      }
      auto put = client.Put(ns, layout_, slices);
      if (!put.ok() || put->blocks_stored() != kBlocksEach) {
        ADD_FAILURE() << "client " << c << ": " << put.status();
        ++failures;
        return;
      }
      auto got = client.Get(ns, layout_, hashes);
      if (!got.ok()) {
        ADD_FAILURE() << "client " << c << ": " << got.status();
        ++failures;
        return;
      }
      for (int i = 0; i < kBlocksEach; ++i) {
        if (!(*got)[i].status.ok() || (*got)[i].record != blocks[i].record) {
          ADD_FAILURE() << "client " << c << " block " << i << ": " << (*got)[i].status;
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->blocks_stored(), static_cast<uint64_t>(kClients * kBlocksEach));
}

TEST_F(CacheServerTest, MatchFindsTheLongestStoredPrefixAndDedupSkipsRepeats) {
  std::vector<TestBlock> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(MakeBlock(layout_, "ns", 100 + i));
  ASSERT_TRUE(client_->Put("ns", layout_, {blocks[0].slices, blocks[1].slices, blocks[3].slices}).ok());
  auto m = client_->Match("ns", layout_,
                          {blocks[0].slices.hash, blocks[1].slices.hash, blocks[2].slices.hash, blocks[3].slices.hash});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->matched_blocks(), 2u);
  ASSERT_EQ(m->tiers_size(), 2);
  EXPECT_EQ(m->tiers(0), v1::TIER_DEVICE);
  auto again = client_->Put("ns", layout_, {blocks[0].slices});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->blocks_stored(), 0u);
  EXPECT_EQ(again->blocks_deduplicated(), 1u);
  // Other tenants see nothing.
  EXPECT_EQ(client_->Match("other", layout_, {blocks[0].slices.hash})->matched_blocks(), 0u);
}

TEST_F(CacheServerTest, BadInputsGetTheirStatusCodes) {
  const TestBlock good = MakeBlock(layout_, "ns", 7);
  v1::KvCache::Stub& stub = client_->stub();
  auto match_code = [&](std::function<void(v1::MatchRequest&)> change) {
    v1::MatchRequest r;
    r.set_kv_namespace("ns");
    *r.mutable_layout() = kvblock::LayoutToProto(layout_);
    r.add_block_hashes(std::string(kvblock::HashAsBytes(good.slices.hash)));
    change(r);
    grpc::ClientContext context;
    client_->SetDeadline(context);
    v1::MatchResponse response;
    return stub.Match(&context, r, &response).error_code();
  };
  EXPECT_EQ(match_code([](auto&) {}), grpc::StatusCode::OK);
  EXPECT_EQ(match_code([](auto& r) { r.set_kv_namespace(""); }), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(match_code([](auto& r) { r.set_kv_namespace("a/b"); }), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(match_code([](auto& r) { r.mutable_layout()->set_codec(v1::KV_CODEC_UNSPECIFIED); }),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(match_code([](auto& r) { r.mutable_layout()->set_layout_id(1); }), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(match_code([](auto& r) { r.mutable_layout()->set_num_layers(0); }), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(match_code([](auto& r) { r.add_block_hashes("short"); }), grpc::StatusCode::INVALID_ARGUMENT);

  v1::PutRequest header;
  header.mutable_header()->set_kv_namespace("ns");
  *header.mutable_header()->mutable_layout() = kvblock::LayoutToProto(layout_);
  auto put_messages = [&](const std::vector<v1::PutRequest>& messages) {
    grpc::ClientContext context;
    client_->SetDeadline(context);
    v1::PutResponse response;
    auto writer = stub.Put(&context, &response);
    for (const v1::PutRequest& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  };
  auto put_code = [&](std::vector<std::string> records, bool with_header = true) {
    std::vector<v1::PutRequest> messages;
    if (with_header) messages.push_back(header);
    for (const std::string& record : records) {
      v1::PutRequest& s = messages.emplace_back();
      s.mutable_slice()->set_block_hash(std::string(kvblock::HashAsBytes(good.slices.hash)));
      s.mutable_slice()->set_data(record);
    }
    return put_messages(messages).error_code();
  };
  const std::string slice = good.slices.records[0];
  std::string corrupt = slice;
  corrupt[1000] ^= 4;
  kvblock::LatentLayout int4 = layout_;
  int4.codec = kernels::Codec::kInt4;
  const std::string wrong_codec = *kvblock::EncodeBlock(int4, 0, 1, Latents(int4.LayerShape().values(), 1));
  EXPECT_EQ(put_code({slice}, /*header=*/false), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(put_code({slice.substr(0, slice.size() - 1)}), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(put_code({slice + "x"}), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(put_code({corrupt}), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(put_code({wrong_codec}), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(put_code({slice, slice}), grpc::StatusCode::INVALID_ARGUMENT);  // layer twice
  EXPECT_EQ(put_code({}), grpc::StatusCode::OK);
  // A stream has one header; every message is a header or slices, at most
  // 4,096 of them (cache.proto); each refusal says which rule it broke.
  v1::PutRequest too_many;
  for (int i = 0; i < 4097; ++i) {
    too_many.mutable_batch()->add_slices()->set_block_hash(std::string(kvblock::HashAsBytes(good.slices.hash)));
  }
  for (const auto& [messages, why] : std::vector<std::pair<std::vector<v1::PutRequest>, std::string>>{
           {{header, header}, "second Put header in one stream"},
           {{header, v1::PutRequest()}, "neither header nor slice"},
           {{header, too_many}, "4097 slices in one batch, at most 4096"}}) {
    const grpc::Status refused = put_messages(messages);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << why;
    EXPECT_NE(refused.error_message().find(why), std::string::npos) << refused.error_message();
  }

  v1::GetRequest get = MakeGetRequest("ns", layout_, {good.slices.hash});
  get.set_layer_begin(layout_.num_layers);
  {
    grpc::ClientContext context;
    client_->SetDeadline(context);
    auto reader = stub.Get(&context, get);
    v1::GetResponse response;
    while (reader->Read(&response)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(client_->ReleaseLease(12345).code(), absl::StatusCode::kNotFound);
  // A missing block is a per-block miss, not a failed stream.
  auto got = client_->Get("ns", layout_, {good.slices.hash});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].status.code(), absl::StatusCode::kNotFound);
  // Nothing was lost: the good block still goes in and comes back.
  ASSERT_TRUE(client_->Put("ns", layout_, {good.slices}).ok());
  got = client_->Get("ns", layout_, {good.slices.hash});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].record, good.record);
  // The corrupt slice is counted as the sender's, not as the store's.
  EXPECT_EQ(client_->Stats()->arrival_checksum_failures(), 1u);
  EXPECT_EQ(client_->Stats()->checksum_failures(), 0u);
}

TEST_F(CacheServerTest, LayerSubsetComesBackAsItsOwnRecord) {
  const TestBlock b = MakeBlock(layout_, "ns", 9);
  ASSERT_TRUE(client_->Put("ns", layout_, {b.slices}).ok());
  v1::GetRequest get = MakeGetRequest("ns", layout_, {b.slices.hash});
  get.set_layer_begin(3);
  get.set_layer_count(2);
  grpc::ClientContext context;
  client_->SetDeadline(context);
  auto reader = client_->stub().Get(&context, get);
  v1::GetResponse response;
  ASSERT_TRUE(reader->Read(&response));
  ASSERT_TRUE(reader->Finish().ok());
  auto view = kvblock::ParseBlock(response.data(), &layout_);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->header.layer_begin, 3u);
  EXPECT_EQ(view->header.layer_count, 2u);
  auto full = kvblock::ParseBlock(b.record, &layout_);
  EXPECT_EQ(view->Layer(0), full->Layer(3));
  EXPECT_EQ(view->Layer(1), full->Layer(4));
}

TEST_F(CacheServerTest, FillingTenTimesOverStaysWithinCapacity) {
  server_.reset();
  Start("128MiB", "128MiB");  // 256 MiB of tiers; 2.5 GiB goes in
  const TestBlock proto = MakeBlock(layout_, "ns", 1);
  const uint64_t capacity = 256ull << 20;
  const size_t blocks = 10 * capacity / proto.record.size();
  constexpr size_t kPerPut = 32;
  for (size_t done = 0; done < blocks; done += kPerPut) {
    std::vector<BlockSlices> batch;
    for (size_t i = done; i < std::min(blocks, done + kPerPut); ++i) {
      BlockSlices s = proto.slices;  // same bytes, new key: stored again
      std::vector<uint32_t> tokens(64, static_cast<uint32_t>(i));
      s.hash = kvblock::ChainHash("ns", kvblock::kNoParent, kvblock::LayoutId(layout_), tokens);
      batch.push_back(std::move(s));
    }
    auto put = client_->Put("ns", layout_, batch);
    ASSERT_TRUE(put.ok()) << put.status();
  }
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  uint64_t used = 0;
  for (const auto& t : stats->tiers()) {
    EXPECT_LE(t.used_bytes(), t.capacity_bytes());
    used += t.used_bytes();
  }
  EXPECT_GT(used, capacity * 8 / 10) << "tiers should be nearly full";
  EXPECT_GT(stats->tiers(1).evictions(), 0u);
  // The whole process, gRPC's buffers and the index included: the tiers,
  // one Put stream's flow-control window (16 MiB, the server runner's) it may
  // hold received, and 8 MiB for the rest. (ASan's and TSan's shadow
  // memory would dwarf it: the sanitizer builds skip this.)
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_LE(server_->OwnAndSharedRssBytes(), capacity + (24 << 20)) << "tier capacity " << capacity;
#endif
}

TEST_F(CacheServerTest, LeasedBlocksSurvivePressure) {
  server_.reset();
  Start("4MiB", "4MiB");
  std::vector<TestBlock> pinned = {MakeBlock(layout_, "ns", 1), MakeBlock(layout_, "ns", 2)};
  ASSERT_TRUE(client_->Put("ns", layout_, {pinned[0].slices, pinned[1].slices}).ok());
  auto m = client_->Match("ns", layout_, {pinned[0].slices.hash, pinned[1].slices.hash}, true, 60000);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->matched_blocks(), 2u);
  for (int round = 0; round < 4; ++round) {
    std::vector<BlockSlices> batch;
    for (int i = 0; i < 8; ++i) batch.push_back(MakeBlock(layout_, "ns", 100 + round * 8 + i).slices);
    auto put = client_->Put("ns", layout_, batch);
    ASSERT_TRUE(put.ok() || put.status().code() == absl::StatusCode::kResourceExhausted) << put.status();
  }
  auto got = client_->Get("ns", layout_, {pinned[0].slices.hash, pinned[1].slices.hash}, m->lease_id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].record, pinned[0].record);
  EXPECT_EQ((*got)[1].record, pinned[1].record);
  EXPECT_EQ(client_->Stats()->active_leases(), 0u) << "the Get naming the lease ended it";
}

// After SIGTERM, health says NOT_SERVING while calls are still served (for
// --drain-ms), then the server drains and exits 0.
TEST_F(CacheServerTest, HealthServesAndSigtermDrainsThenExitsZero) {
  const absl::Status health = CheckHealth(channel_, absl::Seconds(5));
  EXPECT_TRUE(health.ok()) << health << " (SERVING expected)";

  ASSERT_EQ(kill(server_->pid(), SIGTERM), 0);
  absl::Status draining = absl::OkStatus();
  for (int i = 0; i < 100 && draining.ok(); ++i) {
    draining = CheckHealth(channel_, absl::Seconds(1));
    if (draining.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(draining.code(), absl::StatusCode::kUnavailable) << draining;
  EXPECT_NE(draining.message().find("not serving"), std::string::npos) << draining;
  EXPECT_TRUE(client_->Stats().ok()) << "calls are still served while draining";
  EXPECT_EQ(server_->Stop(SIGTERM), 0);
}

TEST_F(CacheServerTest, ReflectionListsTheServices) {
  grpc::GenericStub generic(channel_);
  ListServices call(generic);
  const std::string listing = call.Wait();
  EXPECT_NE(listing.find("kvtier.v1.KvCache"), std::string::npos) << listing;
  EXPECT_NE(listing.find("grpc.health.v1.Health"), std::string::npos) << listing;
}

// The device tier in memory reached only by copies, as a GPU's is
// (`staged-host` stands in for one): every byte back, through demotions
// to the host tier and promotions back.
TEST_F(CacheServerTest, DeviceTierInSlabMemoryServesDemotesAndPromotes) {
  SCOPED_TRACE(rng_.Trace());
  Start("4MiB", "64MiB", {"--device-memory", "staged-host"});
  std::vector<TestBlock> blocks;
  std::vector<BlockSlices> slices;
  std::vector<BlockHash> hashes;
  for (int i = 0; i < 30; ++i) {
    blocks.push_back(MakeBlock(layout_, "ns", rng_.seed() + i));
    slices.push_back(blocks.back().slices);
    hashes.push_back(blocks.back().slices.hash);
  }
  auto put = client_->Put("ns", layout_, slices);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->blocks_stored(), 30u);
  for (int round = 0; round < 2; ++round) {
    auto got = client_->Get("ns", layout_, hashes);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t i = 0; i < blocks.size(); ++i) {
      ASSERT_TRUE((*got)[i].status.ok()) << i << ": " << (*got)[i].status;
      EXPECT_EQ((*got)[i].record, blocks[i].record) << "round " << round << " block " << i;
    }
  }
  const v1::StatsResponse stats = *client_->Stats();
  EXPECT_GT(stats.tiers(0).demotions(), 0u);
  EXPECT_GT(stats.tiers(0).promotions(), 0u);
  EXPECT_LE(stats.tiers(0).used_bytes(), stats.tiers(0).capacity_bytes());
  EXPECT_EQ(stats.checksum_failures(), 0u);
}

TEST_F(CacheServerTest, StatsCommandAndMetricsReportTheSameFigures) {
  const TestBlock b = MakeBlock(layout_, "ns", 3);
  ASSERT_TRUE(client_->Put("ns", layout_, {b.slices}).ok());
  ASSERT_TRUE(client_->Get("ns", layout_, {b.slices.hash}).ok());
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  auto json = RunCommand(std::string(KVTIER_BINARY) + " stats --json --target " + target_);
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_NE(json.output.find("\"tier\": \"device\", \"capacity_bytes\": 67108864, \"used_bytes\": " +
                             std::to_string(stats->tiers(0).used_bytes()) + ", \"blocks\": 1, \"hits\": 1"),
            std::string::npos)
      << json.output;
  auto table = RunCommand(std::string(KVTIER_BINARY) + " stats --target " + target_);
  ASSERT_EQ(table.exit_code, 0);
  EXPECT_NE(table.output.find("device"), std::string::npos) << table.output;
  auto down = RunCommand(std::string(KVTIER_BINARY) + " stats --timeout-ms 500 --target 127.0.0.1:1");
  EXPECT_EQ(down.exit_code, 1) << down.output;

  auto scrape = RunCommand("curl -sf http://" + metrics_address_ + "/metrics");
  ASSERT_EQ(scrape.exit_code, 0) << scrape.output;
  EXPECT_NE(
      scrape.output.find("kvtier_cache_used_bytes{tier=\"device\"} " + std::to_string(stats->tiers(0).used_bytes())),
      std::string::npos)
      << scrape.output;
  EXPECT_NE(scrape.output.find("kvtier_cache_blocks_stored_total 1"), std::string::npos);
  EXPECT_NE(scrape.output.find("kvtier_cache_rpc_duration_seconds_count{code=\"OK\",method=\"Put\"} 1"),
            std::string::npos)
      << scrape.output;
}

// Connections to /metrics that never send a request (a port scanner, a
// stuck client), hundreds of them reopened as fast as they are closed, do
// not blind the scrape behind them. They come from another address than
// the scraper's (127.0.0.2), as a scanner's would.
TEST_F(CacheServerTest, SilentMetricsConnectionsDoNotBlindTheScrape) {
  const size_t colon = metrics_address_.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(metrics_address_.substr(colon + 1))));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  sockaddr_in scanner{};
  scanner.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.2", &scanner.sin_addr);
  auto open_silent = [&] {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&scanner), sizeof scanner), 0);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    return fd;
  };
  std::vector<pollfd> silent;
  for (int i = 0; i < 300; ++i) silent.push_back({open_silent(), POLLIN, 0});
  std::atomic<bool> flooding{true};
  std::atomic<int> reopened{0};
  std::thread flood([&] {
    while (flooding) {
      if (poll(silent.data(), silent.size(), 10) <= 0) continue;
      for (pollfd& p : silent) {
        if (p.revents == 0) continue;
        close(p.fd);
        p.fd = open_silent();
        ++reopened;
      }
    }
  });
  for (int i = 0; i < 5; ++i) {
    auto scrape = std::async(std::launch::async, [&] { return ScrapeMetrics(metrics_address_); });
    const bool answered = scrape.wait_for(std::chrono::seconds(3)) == std::future_status::ready;
    EXPECT_TRUE(answered) << "scrape " << i << " waited behind silent connections";
    if (!answered) break;
    EXPECT_NE(scrape.get().find("kvtier_cache_capacity_bytes"), std::string::npos);
  }
  flooding = false;
  flood.join();
  for (const pollfd& p : silent) close(p.fd);
  EXPECT_GT(reopened.load(), 0) << "the server closed none of the silent connections";
}

TEST_F(CacheServerTest, CancelledPutFreesItsIncompleteBlocks) {
  const TestBlock b = MakeBlock(layout_, "ns", 11);
  {
    grpc::ClientContext context;
    client_->SetDeadline(context);
    v1::PutResponse response;
    auto writer = client_->stub().Put(&context, &response);
    ASSERT_TRUE(writer->Write(HeaderMessage("ns", layout_)));
    for (uint32_t l = 0; l < 3; ++l) ASSERT_TRUE(writer->Write(SliceMessage(b, l)));  // 3 of 8 layers
    ASSERT_TRUE(StatsEventually(*client_, [](const auto& s) { return s.pending_blocks() == 1; }));
    context.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(
      StatsEventually(*client_, [](const auto& s) { return s.pending_blocks() == 0 && s.tiers(0).used_bytes() == 0; }));
  EXPECT_EQ(client_->Match("ns", layout_, {b.slices.hash})->matched_blocks(), 0u);
}

// A Put of a header and 3 of a block's 8 layers, on `context`.
std::unique_ptr<grpc::ClientWriter<v1::PutRequest>> StartPartialPut(CacheClient& client, grpc::ClientContext& context,
                                                                    const kvblock::LatentLayout& layout,
                                                                    const TestBlock& b, v1::PutResponse& response) {
  auto writer = client.stub().Put(&context, &response);
  EXPECT_TRUE(writer->Write(HeaderMessage("ns", layout)));
  for (uint32_t l = 0; l < 3; ++l) EXPECT_TRUE(writer->Write(SliceMessage(b, l)));
  return writer;
}

TEST_F(CacheServerTest, PutThatGoesSilentIsEndedAndItsBlocksFreed) {
  Start("8MiB", "8MiB", {"--put-idle-ms", "500"});
  const TestBlock b = MakeBlock(layout_, "ns", 12);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::PutResponse response;
  const auto start = std::chrono::steady_clock::now();
  auto writer = StartPartialPut(*client_, context, layout_, b, response);
  ASSERT_TRUE(StatsEventually(*client_, [](const auto& s) { return s.pending_blocks() == 1; }));
  // No WritesDone: the client just stops sending, and the server ends it.
  const grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_NE(status.error_message().find("no slice stored for 500ms"), std::string::npos) << status.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));  // the server's limit, not ours
  EXPECT_TRUE(StatsEventually(*client_, [](const auto& s) { return s.pending_blocks() == 0; }));
  EXPECT_EQ(client_->Match("ns", layout_, {b.slices.hash})->matched_blocks(), 0u);
  // Messages that carry no slice (an empty batch every 150 ms) keep
  // neither the stream nor its incomplete block alive.
  {
    grpc::ClientContext chatty_context;
    chatty_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::PutResponse chatty_response;
    const auto chatty_start = std::chrono::steady_clock::now();
    auto chatty = StartPartialPut(*client_, chatty_context, layout_, b, chatty_response);
    v1::PutRequest empty;
    empty.mutable_batch();
    while (std::chrono::steady_clock::now() - chatty_start < std::chrono::seconds(10) && chatty->Write(empty)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
    }
    const grpc::Status chatty_status = chatty->Finish();
    EXPECT_EQ(chatty_status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << chatty_status.error_message();
    EXPECT_NE(chatty_status.error_message().find("no slice stored"), std::string::npos)
        << chatty_status.error_message();
    EXPECT_LT(std::chrono::steady_clock::now() - chatty_start, std::chrono::seconds(10));
    EXPECT_TRUE(StatsEventually(*client_, [](const auto& s) { return s.pending_blocks() == 0; }));
  }
  // A writer whose stream lasts longer than the limit, but that is never
  // silent for as long, stores its block.
  grpc::ClientContext steady_context;
  v1::PutResponse steady_response;
  auto steady = StartPartialPut(*client_, steady_context, layout_, b, steady_response);
  for (uint32_t l = 3; l < layout_.num_layers; ++l) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    ASSERT_TRUE(steady->Write(SliceMessage(b, l)));
  }
  ASSERT_TRUE(steady->WritesDone());
  const grpc::Status steady_status = steady->Finish();
  ASSERT_TRUE(steady_status.ok()) << steady_status.error_message();
  EXPECT_EQ(steady_response.blocks_stored(), 1u);
}

TEST_F(CacheServerTest, ClientThatVanishesMidGetLeavesNothingPinned) {
  std::vector<BlockSlices> blocks;
  std::vector<BlockHash> hashes;
  for (int i = 0; i < 24; ++i) {
    blocks.push_back(MakeBlock(layout_, "ns", 700 + i).slices);
    hashes.push_back(blocks.back().hash);
  }
  ASSERT_TRUE(client_->Put("ns", layout_, blocks).ok());
  auto lease = client_->Match("ns", layout_, {hashes[0], hashes[1]}, true, 60000);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(client_->Stats()->pinned_blocks(), 2u);
  ASSERT_TRUE(client_->ReleaseLease(lease->lease_id()).ok());
  EXPECT_EQ(client_->Stats()->pinned_blocks(), 0u);
  {
    const v1::GetRequest get = MakeGetRequest("ns", layout_, hashes);
    grpc::ClientContext context;
    client_->SetDeadline(context);
    auto reader = client_->stub().Get(&context, get);
    v1::GetResponse response;
    ASSERT_TRUE(reader->Read(&response));
    context.TryCancel();  // the client goes away with 23 blocks unread
    while (reader->Read(&response)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(StatsEventually(*client_, [](const auto& s) { return s.pinned_blocks() == 0; }));
}

TEST_F(CacheServerTest, SigtermLetsAnInFlightGetFinish) {
  std::vector<BlockSlices> blocks;
  std::vector<std::string> records;
  std::vector<BlockHash> hashes;
  for (int i = 0; i < 48; ++i) {
    TestBlock b = MakeBlock(layout_, "ns", 500 + i);
    hashes.push_back(b.slices.hash);
    records.push_back(b.record);
    blocks.push_back(std::move(b.slices));
  }
  ASSERT_TRUE(client_->Put("ns", layout_, blocks).ok());
  const v1::GetRequest get = MakeGetRequest("ns", layout_, hashes);
  grpc::ClientContext context;
  client_->SetDeadline(context);
  auto reader = client_->stub().Get(&context, get);
  v1::GetResponse response;
  ASSERT_TRUE(reader->Read(&response));
  ASSERT_EQ(kill(server_->pid(), SIGTERM), 0);  // while 47 blocks are still to come
  size_t received = 1;
  EXPECT_EQ(response.data(), records[0]);
  while (reader->Read(&response)) {
    EXPECT_EQ(response.data(), records[response.index()]) << response.index();
    ++received;
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(received, hashes.size());
  EXPECT_EQ(server_->Stop(SIGTERM), 0);
}

// A restart with the same --disk-dir finds the disk tier's blocks, and
// those of the memory tiers that the stop moved there (--save-on-stop-ms);
// with --save-on-stop-ms 0, only those that were on disk.
TEST_F(CacheServerTest, RestartWithTheSameDiskDirFindsItsBlocks) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("kvtier_disk_" + std::to_string(rng_.seed()))).string();
  const std::vector<std::string> disk = {"--disk-dir", dir, "--disk-capacity", "64MiB"};
  std::vector<std::string> disk_unsaved = disk;
  disk_unsaved.insert(disk_unsaved.end(), {"--save-on-stop-ms", "0"});
  server_.reset();
  Start("1MiB", "1MiB", disk);  // 6 blocks fit in memory; the rest go to disk
  std::vector<TestBlock> blocks;
  std::vector<BlockSlices> slices;
  std::vector<BlockHash> hashes;
  for (int i = 0; i < 12; ++i) {
    blocks.push_back(MakeBlock(layout_, "ns", 900 + i));
    slices.push_back(blocks.back().slices);
    hashes.push_back(blocks.back().slices.hash);
  }
  ASSERT_TRUE(client_->Put("ns", layout_, slices).ok());
  auto before = client_->Stats();
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->tiers_size(), 3);
  EXPECT_EQ(before->tiers(2).blocks(), 6u);  // 5 pages a block: 3 per memory tier
  EXPECT_EQ(StopAfterTheClient(), 0);

  Start("1MiB", "1MiB", disk_unsaved);
  auto after = client_->Stats();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->tiers(2).blocks(), hashes.size()) << "the memory tiers' blocks were not saved";
  auto got = client_->Get("ns", layout_, hashes);
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < hashes.size(); ++i) {
    ASSERT_TRUE((*got)[i].status.ok()) << i << ": " << (*got)[i].status;
    EXPECT_EQ((*got)[i].record, blocks[i].record) << i;
  }
  // The reads brought some up into memory: without saving, a stop loses them.
  auto read = client_->Stats();
  ASSERT_TRUE(read.ok());
  const uint64_t on_disk = read->tiers(2).blocks();
  ASSERT_LT(on_disk, hashes.size());
  EXPECT_EQ(StopAfterTheClient(), 0);

  Start("1MiB", "1MiB", disk);
  auto last = client_->Stats();
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->tiers(2).blocks(), on_disk);
  std::filesystem::remove_all(dir);
}

// A second cache started on a --disk-dir another uses is refused before
// it touches it (its start would delete the first's temporary files, and
// each would remove files the other holds); the first serves on.
TEST_F(CacheServerTest, ASecondCacheOnTheSameDiskDirIsRefused) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("kvtier_shared_disk_" + std::to_string(rng_.seed()))).string();
  server_.reset();
  Start("1MiB", "1MiB", {"--disk-dir", dir, "--disk-capacity", "64MiB"});
  std::vector<TestBlock> blocks;
  std::vector<BlockSlices> slices;
  for (int i = 0; i < 12; ++i) {
    blocks.push_back(MakeBlock(layout_, "ns", 700 + i));
    slices.push_back(blocks.back().slices);
  }
  ASSERT_TRUE(client_->Put("ns", layout_, slices).ok());
  // Bounded: a second cache that starts serves until it is stopped.
  const std::string command = "timeout 30 " + std::string(KVTIER_CACHE_BINARY) +
                              " --listen 127.0.0.1:0 --metrics-listen '' --device-capacity 1MiB --host-capacity 1MiB "
                              "--disk-capacity 64MiB --disk-dir " +
                              dir;
  const CommandResult second = RunCommand(command);
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("--disk-dir " + dir + " is in use by another kvtier-cache (pid " +
                               std::to_string(server_->pid()) + ")"),
            std::string::npos)
      << second.output;
  std::vector<BlockHash> hashes;
  for (const TestBlock& b : blocks) hashes.push_back(b.slices.hash);
  auto got = client_->Get("ns", layout_, hashes);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < hashes.size(); ++i) {
    ASSERT_TRUE((*got)[i].status.ok()) << i << ": " << (*got)[i].status;
    EXPECT_EQ((*got)[i].record, blocks[i].record) << i;
  }
  EXPECT_EQ(StopAfterTheClient(), 0);
  std::filesystem::remove_all(dir);
}

TEST_F(CacheServerTest, RawGetLandsRecordsInTheCallersBuffer) {
  std::vector<TestBlock> blocks = {MakeBlock(layout_, "ns", 41), MakeBlock(layout_, "ns", 42)};
  ASSERT_TRUE(client_->Put("ns", layout_, {blocks[0].slices, blocks[1].slices}).ok());
  const TestBlock absent = MakeBlock(layout_, "ns", 43);
  const v1::GetRequest get =
      MakeGetRequest("ns", layout_, {blocks[0].slices.hash, absent.slices.hash, blocks[1].slices.hash});
  std::vector<std::vector<uint8_t>> pool(3, std::vector<uint8_t>(blocks[0].record.size() + 8, 0xee));
  grpc::ClientContext context;
  client_->SetDeadline(context);
  std::vector<RawBlock> got;
  grpc::Status status = RawGet(
      channel_.get(), &context, get, [&](uint32_t index, size_t) { return std::span<uint8_t>(pool[index]); },
      [&](const RawBlock& block) { got.push_back(block); });
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1].status.code(), absl::StatusCode::kNotFound);
  for (int i : {0, 2}) {
    EXPECT_TRUE(got[i].status.ok());
    EXPECT_EQ(got[i].tier, v1::TIER_DEVICE);
    ASSERT_EQ(got[i].size, blocks[i / 2].record.size());
    EXPECT_EQ(std::string(pool[i].begin(), pool[i].begin() + got[i].size), blocks[i / 2].record);
    EXPECT_EQ(pool[i][got[i].size], 0xee) << "wrote past the record";
  }
}

TEST_F(CacheServerTest, RawGetCancelsAtAnAnswerWithNoRoomAndReturns) {
  std::vector<TestBlock> blocks;
  std::vector<BlockSlices> slices;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(MakeBlock(layout_, "ns", 70 + i));
    slices.push_back(blocks.back().slices);
  }
  ASSERT_TRUE(client_->Put("ns", layout_, slices).ok());
  std::vector<kvblock::BlockHash> hashes;
  for (const TestBlock& b : blocks) hashes.push_back(b.slices.hash);
  std::vector<uint8_t> room(blocks[0].record.size());
  grpc::ClientContext context;
  client_->SetDeadline(context);
  std::vector<uint32_t> landed;
  // Index 1 gets no room: the stream is cancelled there and drained, and
  // nothing after it lands.
  const grpc::Status status = RawGet(
      channel_.get(), &context, MakeGetRequest("ns", layout_, hashes),
      [&](uint32_t index, size_t) { return index == 1 ? std::span<uint8_t>() : std::span<uint8_t>(room); },
      [&](const RawBlock& block) { landed.push_back(block.index); });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(status.error_message().find("no room"), std::string::npos) << status.error_message();
  EXPECT_EQ(landed, std::vector<uint32_t>{0});
}

TEST(RawGetWithoutServer, AnswersTheCallsErrorAndLandsNothing) {
  const int port = FreeLoopbackPort();  // nothing listens there
  ASSERT_GT(port, 0) << "no free loopback port";
  std::shared_ptr<grpc::Channel> channel = MakeChannel("127.0.0.1:" + std::to_string(port));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const kvblock::LatentLayout layout = TestLayout();
  int landed = 0;
  const grpc::Status status = RawGet(
      channel.get(), &context, MakeGetRequest("ns", layout, {MakeBlock(layout, "ns", 1).slices.hash}),
      [](uint32_t, size_t) { return std::span<uint8_t>(); }, [&](const RawBlock&) { ++landed; });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_EQ(landed, 0);
}

TEST_F(CacheServerTest, OnlyConfiguredNamespacesAreServed) {
  server_.reset();
  Start("8MiB", "8MiB", {"--namespaces", "tenant-a,tenant-b"});
  const TestBlock b = MakeBlock(layout_, "tenant-a", 61);
  ASSERT_TRUE(client_->Put("tenant-a", layout_, {b.slices}).ok());
  auto m = client_->Match("tenant-c", layout_, {b.slices.hash});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("unknown namespace 'tenant-c'"), std::string::npos) << m.status();
  EXPECT_EQ(client_->Put("tenant-c", layout_, {b.slices}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Get("tenant-c", layout_, {b.slices.hash}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Match("tenant-a", layout_, {b.slices.hash})->matched_blocks(), 1u);
}

TEST_F(CacheServerTest, TakesSizesAsKubernetesWritesThem) {
  Start("8Mi", "1.5Mi");
  absl::StatusOr<v1::StatsResponse> stats = client_->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->tiers(0).capacity_bytes(), 8u << 20);
  EXPECT_EQ(stats->tiers(1).capacity_bytes(), 3u << 19);
}

TEST(CacheServerFlags, RefusesBadCapacitiesWithAMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--host-capacity", "1GiB"}, "--device-capacity and --host-capacity are required"},
      {{"--device-capacity", "0", "--host-capacity", "1GiB"}, "below one page"},
      {{"--device-capacity", "1PiB", "--host-capacity", "1GiB"}, "unknown unit"},
      {{"--device-capacity", "1000TiB", "--host-capacity", "1GiB"}, "exceeds the memory this process may use"},
      // A sum past 2^64 is said as it is, not wrapped.
      {{"--device-capacity", "18446744073709551615", "--host-capacity", "1GiB"},
       "--host-capacity = 18446744074783293439 bytes exceeds"},
      {{"--device-capacity", "1.5.5GiB", "--host-capacity", "1GiB"}, "unknown unit"},
      {{"--device-capacity", "abc", "--host-capacity", "1GiB"}, "not a size"},
      {{"--device-capacity", "1GiB", "--host-capacity", "1GiB", "--listen", "nowhere"}, "HOST:PORT"},
      {{"--device-capacity", "1GiB", "--host-capacity", "1GiB", "--namespaces", "a,b/c"},
       "--namespaces: kv_namespace may hold only"},
      {{"--device-capacity", "1GiB", "--host-capacity", "1GiB", "--disk-dir", "/tmp/x"},
       "--disk-dir and --disk-capacity go together"},
      {{"--device-capacity", "1GiB", "--host-capacity", "1GiB", "--disk-dir", "/tmp/x", "--disk-capacity", "0"},
       "--disk-capacity: must be positive"},
      {{"--device-capacity", "1GiB", "--host-capacity", "1GiB", "--page-size", "67108865"},
       "--page-size must be within 4KiB..64MiB"},
      {{"--device-capacity", "1GiB", "--host-capacity", "1GiB", "--disk-dir", "/proc/no", "--disk-capacity", "1GiB"},
       "--disk-dir /proc/no"},
      {{"--device-capacity", "1GiB", "--host-capacity", "1GiB", "--eviction", "fifo"},
       "--eviction fifo is not adaptive, leaf-first or lru"},
      {{"--device-capacity", "1MiB", "--host-capacity", "1MiB", "--listen", "127.0.0.1:0", "--drain-ms", "600001"},
       "--drain-ms 600001: must be 0 to 600000"},
  };
  for (const Case& c : cases) {
    std::string cmd = KVTIER_CACHE_BINARY;
    for (const auto& a : c.args) cmd += " " + a;
    auto r = RunCommand(cmd);
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << cmd << "\n" << r.output;
    // The error alone, not after a warning about what was not asked.
    EXPECT_EQ(r.output.find("--tenants"), std::string::npos) << cmd << "\n" << r.output;
  }
}

// A usage error stops the server before it makes its tiers: a disk tier's
// directory is not even created, nor metrics served.
TEST(CacheServerFlags, UsageErrorsStopItBeforeItsTiers) {
  const std::filesystem::path parent =
      std::filesystem::temp_directory_path() / ("kvtier_usage_" + std::to_string(getpid()));
  std::filesystem::create_directories(parent);
  const std::filesystem::path dir = parent / "tier", no_tls = parent / "no-tls";
  const std::pair<std::string, std::string> cases[] = {
      {"--threads 0", "--threads 0: must be 1 to 1024"},
      {"--put-idle-ms 0", "--put-idle-ms must be positive"},
      {"--drain-ms 600001", "--drain-ms 600001: must be 0 to 600000"},
      {"--save-on-stop-ms 600001", "--save-on-stop-ms 600001: must be 0 to 600000"},
      {"--max-connection-age-seconds 604801", "--max-connection-age-seconds 604801: must be 0 to 604800 (a week)"},
      {"--health-listen nowhere", "--health-listen: address 'nowhere' is not HOST:PORT"},
      {"--metrics-listen 127.0.0.1:99999", "--metrics-listen: address '127.0.0.1:99999' is not HOST:PORT"},
      {"--tls-dir " + no_tls.string(), "--tls-dir: cannot read " + no_tls.string() + "/ca.crt"},
      {"--fast-path-staging 12XB", "--fast-path-staging: '12XB'"},
      {"--page-size 2048", "--page-size must be within 4KiB..64MiB"},
      {"--device-memory gpu", "--device-memory must be auto, cuda, host or staged-host"},
  };
  for (const auto& [flag, why] : cases) {
    const std::string command = std::string(KVTIER_CACHE_BINARY) +
                                " --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --device-capacity 1MiB "
                                "--host-capacity 1MiB --disk-capacity 1MiB --disk-dir " +
                                dir.string() + " " + flag;
    const CommandResult r = RunCommand(command);
    EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.output;
    EXPECT_NE(r.output.find(why), std::string::npos) << command << "\n" << r.output;
    EXPECT_EQ(r.output.find("metrics on"), std::string::npos) << command << "\n" << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir)) << command;
  }
  std::filesystem::remove_all(parent);
}

// DeepSeek-V4 over two real shards: a restore point is written beside its
// block (the shard of the block's key, not its own), and MatchPrefix
// combines both shards' answers into the longest stored prefix that ends
// at a point, wherever the blocks before it lie; Fetch finds the point
// where it was written.
TEST(ShardedV4, PointsLieBesideTheirBlocksAndThePrefixSpansShards) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::vector<std::unique_ptr<ChildProcess>> servers;
  std::string targets;
  for (int i = 0; i < 2; ++i) {
    servers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{KVTIER_CACHE_BINARY, "--listen", "127.0.0.1:0", "--metrics-listen", "",
                                 "--device-capacity", "4MiB", "--host-capacity", "4MiB"}));
    const int port = servers.back()->WaitForListeningPort();
    ASSERT_GT(port, 0);
    targets += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(port);
  }
  auto shards = ShardSet::Create(targets, absl::Seconds(5), /*fast_path=*/false);
  ASSERT_TRUE(shards.ok()) << shards.status();
  const kvblock::LatentLayout layout = testing::SmallV4Layout();
  // Eight blocks, the first five on both shards.
  std::vector<BlockHash> chain;
  std::set<std::string> first_five;
  while (chain.size() < 8 || first_five.size() < 2) {
    if (chain.size() == 8) chain.clear(), first_five.clear();
    BlockHash h;
    for (uint8_t& b : h) b = static_cast<uint8_t>(rng.engine()());
    chain.push_back(h);
    if (chain.size() <= 5) first_five.insert((*shards)->ShardOf(h));
  }
  const auto point = [&](size_t block) {
    return testing::RandomV4Record(layout, kvblock::RecordKind::kRestorePoint, (block + 1) * layout.tokens_per_block,
                                   rng.engine());
  };
  const auto store = [&](const std::vector<size_t>& blocks, const std::vector<size_t>& points) {
    ShardedPut put(**shards, "ns", layout, absl::Seconds(5));
    for (size_t b : blocks)
      put.Write(chain[b], testing::RandomV4Record(layout, kvblock::RecordKind::kBlock, 0, rng.engine()));
    for (size_t b : points) put.Write(kvblock::RestorePointKey(chain[b]), point(b), chain[b]);
    return put.Finish().size();
  };
  ASSERT_EQ(store({0, 1, 2, 3, 4, 5}, {1, 4}), 8u);
  EXPECT_EQ((*shards)->MatchPrefix("ns", layout, chain), 5u) << "the point after block 4";
  EXPECT_EQ((*shards)->MatchPrefix("ns", layout, std::vector<BlockHash>(chain.begin(), chain.begin() + 4)), 2u);
  // Each point is on its block's shard, and Fetch finds it there.
  const BlockHash key = kvblock::RestorePointKey(chain[4]);
  const auto fetched = (*shards)->Fetch("ns", layout, {key}, "", {chain[4]});
  ASSERT_TRUE(fetched[0].ok()) << fetched[0].status();
  EXPECT_TRUE(kvblock::ParseBlock(**fetched[0], &layout).ok());
  CacheClient holder(MakeChannel((*shards)->ShardOf(chain[4])), absl::Seconds(5));
  EXPECT_EQ(holder.Match("ns", layout, {chain[4]})->stored_blocks(), 1u);
  EXPECT_EQ(holder.Match("ns", layout, {chain[4]})->restore_points_size(), 1);
  // With no point stored after a later block, the prefix ends at the last one.
  ASSERT_EQ(store({6, 7}, {}), 2u);
  EXPECT_EQ((*shards)->MatchPrefix("ns", layout, chain), 5u);
  ASSERT_EQ(store({}, {7}), 1u);
  EXPECT_EQ((*shards)->MatchPrefix("ns", layout, chain), 8u);
}

}  // namespace
}  // namespace kvtier::cache
