// ShardSet's streams over TCP, against stand-in KvCache servers. Fetch
// checks each record as it lands: a real kvtier-cache never sends a record
// that fails its CRC (it checks on every read), so bytes damaged on the way
// can only come from a stand-in that answers Get with chosen records, one
// of them with a flipped byte, one of another layout. Concurrent streams
// (Gets, Puts) go over connections of their own, and so do the runs a
// large read is cut into.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "services/cache/client/shard_routes.h"
#include "services/cache/client/shard_set.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/block_key.h"
#include "services/rpc/client_identity.h"
#include "tests/test_random.h"
#include "tests/v4_records.h"

namespace kvtier::cache {
namespace {

kvblock::LatentLayout Layout() {
  return {.model_id = "fetch-test",
          .num_layers = 3,
          .kv_lora_rank = 32,
          .rope_dim = 8,
          .tokens_per_block = 16,
          .codec = kernels::Codec::kInt8};
}

std::string RandomRecord(const kvblock::LatentLayout& layout, std::mt19937_64& rng) {
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<float> x(layout.LayerShape().values() * layout.num_layers);
  for (float& v : x) v = value(rng);
  return *kvblock::EncodeBlock(layout, 0, layout.num_layers, x);
}

// Answers every Get with `records`, in order, whatever was asked.
class StandInCache final : public v1::KvCache::Service {
 public:
  explicit StandInCache(std::vector<std::string> records) : records_(std::move(records)) {}
  grpc::Status Get(grpc::ServerContext*, const v1::GetRequest* request,
                   grpc::ServerWriter<v1::GetResponse>* writer) override {
    for (size_t i = 0; i < records_.size() && i < static_cast<size_t>(request->block_hashes_size()); ++i) {
      v1::GetResponse answer;
      answer.set_index(static_cast<uint32_t>(i));
      answer.set_block_hash(request->block_hashes(static_cast<int>(i)));
      answer.set_data(records_[i]);
      writer->Write(answer);
    }
    return grpc::Status::OK;
  }

 private:
  std::vector<std::string> records_;
};

// `service` on a free loopback port; null if it did not start.
std::unique_ptr<grpc::Server> Serve(grpc::Service& service, int& port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  return port > 0 ? std::move(server) : nullptr;
}

// Fetches `hashes` of `layout` over TCP from a StandInCache answering `sent`.
std::vector<absl::StatusOr<SharedRecord>> FetchFromStandIn(std::vector<std::string> sent,
                                                           const kvblock::LatentLayout& layout,
                                                           const std::vector<kvblock::BlockHash>& hashes) {
  StandInCache service(std::move(sent));
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(service, port);
  if (server == nullptr) {
    ADD_FAILURE() << "the stand-in cache did not start";
    return {};
  }
  auto shards = ShardSet::Create("127.0.0.1:" + std::to_string(port), absl::Seconds(10), /*fast_path=*/false);
  if (!shards.ok()) {
    ADD_FAILURE() << shards.status();
    return {};
  }
  std::vector<absl::StatusOr<SharedRecord>> got = (*shards)->Fetch("tenant", layout, hashes);
  server->Shutdown();
  return got;
}

TEST(ShardSetFetch, RecordsOverTcpAreCheckedAsTheyLand) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const kvblock::LatentLayout layout = Layout();
  std::vector<std::string> records;
  for (int i = 0; i < 4; ++i) records.push_back(RandomRecord(layout, rng.engine()));
  std::vector<std::string> sent = records;
  sent[1][kvblock::kBlockHeaderBytes + rng.engine()() % (sent[1].size() - kvblock::kBlockHeaderBytes)] ^= 0x08;
  kvblock::LatentLayout other = layout;
  other.kv_lora_rank = 24;
  sent[3] = RandomRecord(other, rng.engine());
  sent[3].resize(records[3].size(), '\0');  // the size asked for, the wrong layout inside

  std::vector<std::uint32_t> tokens(layout.tokens_per_block * records.size());
  for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<uint32_t>(t);
  const std::vector<kvblock::BlockHash> hashes =
      kvblock::ComputeBlockChain("tenant", kvblock::LayoutId(layout), layout.tokens_per_block, tokens);
  const std::vector<absl::StatusOr<SharedRecord>> got = FetchFromStandIn(sent, layout, hashes);
  ASSERT_EQ(got.size(), records.size());
  for (size_t i : {0, 2}) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    EXPECT_EQ(**got[i], records[i]);
    EXPECT_TRUE(kvblock::ParseBlock(**got[i], &layout).ok());
  }
  EXPECT_EQ(got[1].status().code(), absl::StatusCode::kDataLoss) << got[1].status();
  EXPECT_FALSE(got[3].ok());
}

// DeepSeek-V4's records (a block, a restore point: sizes of their own)
// land and are checked; one damaged is DATA_LOSS, and one larger than any
// of the layout's gets no room.
TEST(ShardSetFetch, V4RecordsOfEachKindLandAndAreChecked) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const kvblock::LatentLayout layout = testing::SmallV4Layout();
  const auto record = [&](kvblock::RecordKind kind, uint64_t boundary) {
    return testing::RandomV4Record(layout, kind, boundary, rng.engine());
  };
  const std::vector<std::string> records = {record(kvblock::RecordKind::kBlock, 0),
                                            record(kvblock::RecordKind::kRestorePoint, 48)};
  std::vector<std::string> sent = records;
  sent.push_back(records[0]);
  sent.back()[40] ^= 0x20;
  sent.push_back(records[1] + std::string(4096, 'x'));  // larger than any of the layout's: it ends the stream

  std::vector<kvblock::BlockHash> hashes;
  for (uint8_t i = 0; i < sent.size(); ++i) hashes.push_back(kvblock::BlockHash{i});
  const std::vector<absl::StatusOr<SharedRecord>> got = FetchFromStandIn(sent, layout, hashes);
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i : {0, 1}) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    EXPECT_EQ(**got[i], records[i]);
  }
  EXPECT_EQ(got[2].status().code(), absl::StatusCode::kDataLoss) << got[2].status();
  EXPECT_FALSE(got[3].ok());
  EXPECT_NE(got[3].status().message().find("no room"), std::string::npos) << got[3].status();
}

// Answers Get with `record` for every hash asked, and takes every Put
// (storing nothing), noting each caller's address (its connection). The
// first `together` calls wait until all of them have arrived (or 10 s), so
// that they are in flight at once.
class PeerNotingCache final : public v1::KvCache::Service {
 public:
  PeerNotingCache(std::string record, size_t together) : record_(std::move(record)), together_(together) {}
  grpc::Status Get(grpc::ServerContext* context, const v1::GetRequest* request,
                   grpc::ServerWriter<v1::GetResponse>* writer) override {
    Arrive(context->peer());
    for (int i = 0; i < request->block_hashes_size(); ++i) {
      v1::GetResponse answer;
      answer.set_index(static_cast<uint32_t>(i));
      answer.set_block_hash(request->block_hashes(i));
      answer.set_data(record_);
      writer->Write(answer);
    }
    return grpc::Status::OK;
  }
  grpc::Status Put(grpc::ServerContext* context, grpc::ServerReader<v1::PutRequest>* reader,
                   v1::PutResponse*) override {
    Arrive(context->peer());
    v1::PutRequest request;
    while (reader->Read(&request)) {
    }
    return grpc::Status::OK;
  }
  std::vector<std::string> peers() {
    absl::MutexLock lock(&mu_);
    return peers_;
  }

 private:
  void Arrive(const std::string& peer) {
    absl::MutexLock lock(&mu_);
    peers_.push_back(peer);
    mu_.AwaitWithTimeout(absl::Condition(this, &PeerNotingCache::AllArrived), absl::Seconds(10));
  }
  bool AllArrived() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return peers_.size() >= together_; }
  const std::string record_;
  const size_t together_;
  absl::Mutex mu_;
  std::vector<std::string> peers_ ABSL_GUARDED_BY(mu_);
};

// Runs `call` from `together` threads at once, then twice alone, and
// checks the connections `service` saw them on: the calls in flight at once
// on connections of their own, the lone ones on one.
void ExpectConnectionsOfTheirOwn(PeerNotingCache& service, size_t together, const std::function<void(uint32_t)>& call) {
  std::vector<std::thread> threads;
  for (size_t k = 0; k < together; ++k) threads.emplace_back(call, static_cast<uint32_t>(k));
  for (std::thread& t : threads) t.join();
  call(100);  // then one at a time
  call(101);
  const std::vector<std::string> peers = service.peers();
  ASSERT_EQ(peers.size(), together + 2);
  EXPECT_EQ(std::set<std::string>(peers.begin(), peers.begin() + together).size(), together)
      << "calls in flight at once shared a connection";
  EXPECT_EQ(peers[together], peers[together + 1]) << "a lone call changed connections";
}

// Fetches in flight at once from one ShardSet go over connections of their
// own (one HTTP/2 connection carries about one stream's rate), and a lone
// reader keeps to one connection.
TEST(ShardSetFetch, ConcurrentFetchesUseConnectionsOfTheirOwn) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const kvblock::LatentLayout layout = Layout();
  constexpr size_t kTogether = 3;
  PeerNotingCache service(RandomRecord(layout, rng.engine()), kTogether);
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(service, port);
  ASSERT_NE(server, nullptr);
  auto shards = ShardSet::Create("127.0.0.1:" + std::to_string(port), absl::Seconds(20), /*fast_path=*/false);
  ASSERT_TRUE(shards.ok()) << shards.status();
  std::vector<std::uint32_t> tokens(layout.tokens_per_block * 2);
  for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<uint32_t>(rng.engine()() % 1000);
  const std::vector<kvblock::BlockHash> hashes =
      kvblock::ComputeBlockChain("tenant", kvblock::LayoutId(layout), layout.tokens_per_block, tokens);
  ExpectConnectionsOfTheirOwn(service, kTogether, [&](uint32_t) {
    for (const absl::StatusOr<SharedRecord>& r : (*shards)->Fetch("tenant", layout, hashes)) {
      EXPECT_TRUE(r.ok()) << r.status();
    }
  });
  server->Shutdown();
}

// So do a prefill node's concurrent stores (ShardedPut's Put streams).
TEST(ShardSetStore, ConcurrentStoresUseConnectionsOfTheirOwn) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const kvblock::LatentLayout layout = Layout();
  constexpr size_t kTogether = 3;
  PeerNotingCache service(/*record=*/"", kTogether);
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(service, port);
  ASSERT_NE(server, nullptr);
  auto shards = ShardSet::Create("127.0.0.1:" + std::to_string(port), absl::Seconds(20), /*fast_path=*/false);
  ASSERT_TRUE(shards.ok()) << shards.status();
  const std::string record = RandomRecord(layout, rng.engine());
  ExpectConnectionsOfTheirOwn(service, kTogether, [&](uint32_t seed) {
    const std::vector<uint32_t> tokens(layout.tokens_per_block, seed);
    const kvblock::BlockHash hash =
        kvblock::ComputeBlockChain("tenant", kvblock::LayoutId(layout), layout.tokens_per_block, tokens)[0];
    ShardedPut put(**shards, "tenant", layout, absl::Seconds(20));
    put.Write(hash, record);
    EXPECT_EQ(put.Finish(), std::set<kvblock::BlockHash>{hash});
  });
  server->Shutdown();
}

// How many of `channels` channels of their own, each made and called once
// at the same time from a thread of its own, failed to connect to a stand-in
// cache started here; says why on stderr.
int ChannelsThatFailedToConnect(int channels) {
  StandInCache service({});  // answers Stats UNIMPLEMENTED: reached
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(service, port);
  if (server == nullptr) return channels;
  std::vector<std::shared_ptr<grpc::Channel>> made;
  for (int i = 0; i < channels; ++i) made.push_back(MakeChannel("127.0.0.1:" + std::to_string(port), Connection::kOwn));
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (const std::shared_ptr<grpc::Channel>& channel : made) {
    threads.emplace_back([&failed, channel] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::StatsResponse answer;
      const grpc::Status status = v1::KvCache::NewStub(channel)->Stats(&context, v1::StatsRequest(), &answer);
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        ++failed;
        std::cerr << status.error_message() << "\n";
      }
    });
  }
  for (std::thread& t : threads) t.join();
  server->Shutdown();
  return failed;
}

// Channels that connect at once in a process that has made none before (a
// worker's first large read) all connect: where gRPC 1.51 let the process's
// first mutex wait overwrite connect(2)'s errno, some processes lost a
// connection to "No such file or directory" (MakeChannel says why). Each
// try is a fresh process, the test binary run again for this statement.
TEST(MakeChannel, ChannelsConnectingAtOnceInAFreshProcessAllConnect) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (int process = 0; process < 40; ++process) {
    EXPECT_EXIT(std::_Exit(ChannelsThatFailedToConnect(32)), ::testing::ExitedWithCode(0), "") << "process " << process;
  }
}

// Answers each Get with the records stored under the hashes it asks for,
// index by index, once `together` calls have arrived (or 10 s passed),
// noting each call's peer and the hashes it asked for. A call that asks
// for `failing` fails, UNAVAILABLE, after its first answer.
class RecordsByHash final : public v1::KvCache::Service {
 public:
  RecordsByHash(std::map<std::string, std::string> records, size_t together, std::string failing = {})
      : records_(std::move(records)), together_(together), failing_(std::move(failing)) {}
  grpc::Status Get(grpc::ServerContext* context, const v1::GetRequest* request,
                   grpc::ServerWriter<v1::GetResponse>* writer) override {
    const std::vector<std::string> asked(request->block_hashes().begin(), request->block_hashes().end());
    {
      absl::MutexLock lock(&mu_);
      calls_.push_back({context->peer(), asked});
      all_arrived_ = mu_.AwaitWithTimeout(absl::Condition(this, &RecordsByHash::AllArrived), absl::Seconds(10));
    }
    const bool fails = std::find(asked.begin(), asked.end(), failing_) != asked.end();
    for (size_t i = 0; i < asked.size(); ++i) {
      if (fails && i == 1) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stand-in's stream failed");
      v1::GetResponse answer;
      answer.set_index(static_cast<uint32_t>(i));
      answer.set_block_hash(asked[i]);
      answer.set_data(records_.at(asked[i]));
      writer->Write(answer);
    }
    return grpc::Status::OK;
  }
  struct Call {
    std::string peer;
    std::vector<std::string> hashes;
  };
  std::vector<Call> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  bool all_arrived() {
    absl::MutexLock lock(&mu_);
    return all_arrived_;
  }

 private:
  bool AllArrived() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.size() >= together_; }
  const std::map<std::string, std::string> records_;
  const size_t together_;
  const std::string failing_;
  absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  bool all_arrived_ ABSL_GUARDED_BY(mu_) = false;
};

std::string Bytes(const kvblock::BlockHash& hash) { return std::string(hash.begin(), hash.end()); }

// A prefix of `blocks` records of about a megabyte each, under their chain
// of hashes.
struct LargePrefix {
  kvblock::LatentLayout layout{.model_id = "split-fetch-test",
                               .num_layers = 27,
                               .kv_lora_rank = 512,
                               .rope_dim = 64,
                               .tokens_per_block = 64,
                               .codec = kernels::Codec::kInt8};
  std::vector<kvblock::BlockHash> hashes;
  std::map<std::string, std::string> records;  // by hash

  LargePrefix(size_t blocks, std::mt19937_64& rng) {
    std::vector<std::uint32_t> tokens(layout.tokens_per_block * blocks);
    for (std::uint32_t& t : tokens) t = static_cast<uint32_t>(rng() % 100000);
    hashes = kvblock::ComputeBlockChain("tenant", kvblock::LayoutId(layout), layout.tokens_per_block, tokens);
    for (const kvblock::BlockHash& h : hashes) records[Bytes(h)] = RandomRecord(layout, rng);
  }
};

// `service` on a free loopback port, and a ShardSet of it alone over TCP
// that reads in up to `streams` streams at once; null members if either
// did not start.
struct OneShard {
  OneShard(grpc::Service& service, size_t streams) {
    int port = 0;
    server = Serve(service, port);
    if (server == nullptr) return;
    absl::StatusOr<std::unique_ptr<ShardSet>> made =
        ShardSet::Create("127.0.0.1:" + std::to_string(port), absl::Seconds(30), /*fast_path=*/false,
                         ShardSet::kIdleRecordBytes, streams);
    if (made.ok()) shards = *std::move(made);
  }
  ~OneShard() {
    if (server != nullptr) server->Shutdown();
  }
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<ShardSet> shards;
};

// A read of more than GrpcRoute::kStreamBytes of one shard's blocks is cut
// into consecutive runs read at once, each a stream on a connection of its
// own, and every record lands at its own index.
TEST(ShardSetFetch, ALargeReadIsCutIntoStreamsReadAtOnce) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  constexpr size_t kStreams = 4;
  const LargePrefix prefix(33 + rng.engine()() % 31, rng.engine());
  ASSERT_GE(prefix.records.begin()->second.size() * prefix.hashes.size(), kStreams * GrpcRoute::kStreamBytes);
  RecordsByHash service(prefix.records, kStreams);
  OneShard shard(service, kStreams);
  ASSERT_NE(shard.shards, nullptr);
  const std::vector<absl::StatusOr<SharedRecord>> got = shard.shards->Fetch("tenant", prefix.layout, prefix.hashes);
  ASSERT_EQ(got.size(), prefix.hashes.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    EXPECT_EQ(**got[i], prefix.records.at(Bytes(prefix.hashes[i]))) << "block " << i;
  }
  std::vector<RecordsByHash::Call> calls = service.calls();
  ASSERT_EQ(calls.size(), kStreams);
  EXPECT_TRUE(service.all_arrived()) << "the streams were not read at once";
  std::set<std::string> peers;
  for (const RecordsByHash::Call& call : calls) peers.insert(call.peer);
  EXPECT_EQ(peers.size(), kStreams) << "streams shared a connection";
  std::sort(calls.begin(), calls.end(), [](const RecordsByHash::Call& a, const RecordsByHash::Call& b) {
    return a.hashes.size() < b.hashes.size();
  });
  EXPECT_LE(calls.back().hashes.size(), calls.front().hashes.size() + 1) << "runs of unequal lengths";
  std::map<std::string, size_t> position;
  for (size_t i = 0; i < prefix.hashes.size(); ++i) position[Bytes(prefix.hashes[i])] = i;
  std::sort(calls.begin(), calls.end(), [&](const RecordsByHash::Call& a, const RecordsByHash::Call& b) {
    return position.at(a.hashes[0]) < position.at(b.hashes[0]);
  });
  std::vector<std::string> asked;
  for (const RecordsByHash::Call& call : calls) asked.insert(asked.end(), call.hashes.begin(), call.hashes.end());
  std::vector<std::string> all;
  for (const kvblock::BlockHash& h : prefix.hashes) all.push_back(Bytes(h));
  EXPECT_EQ(asked, all) << "the runs, in order, are not the prefix once over";
}

// With one stream asked for, or blocks under kStreamBytes, a read is one
// stream; and where one run's stream fails, only its blocks not yet
// arrived carry the shard's error.
TEST(ShardSetFetch, ASmallReadIsOneStreamAndAFailedRunLosesOnlyItsOwn) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const LargePrefix prefix(64, rng.engine());
  const std::vector<kvblock::BlockHash> few(prefix.hashes.begin(), prefix.hashes.begin() + 4);
  for (auto [hashes, streams] : {std::pair{prefix.hashes, size_t{1}}, std::pair{few, size_t{4}}}) {
    RecordsByHash service(prefix.records, /*together=*/1);
    OneShard shard(service, streams);
    ASSERT_NE(shard.shards, nullptr);
    for (const absl::StatusOr<SharedRecord>& r : shard.shards->Fetch("tenant", prefix.layout, hashes)) {
      EXPECT_TRUE(r.ok()) << r.status();
    }
    EXPECT_EQ(service.calls().size(), 1u) << hashes.size() << " blocks, " << streams << " streams asked for";
  }

  // Four runs of 16; the third run's stream fails after its first block.
  RecordsByHash service(prefix.records, /*together=*/4, Bytes(prefix.hashes[40]));
  OneShard shard(service, 4);
  ASSERT_NE(shard.shards, nullptr);
  const std::vector<absl::StatusOr<SharedRecord>> got = shard.shards->Fetch("tenant", prefix.layout, prefix.hashes);
  ASSERT_EQ(got.size(), 64u);
  for (size_t i = 0; i < got.size(); ++i) {
    if (i > 32 && i < 48) {
      EXPECT_EQ(got[i].status().code(), absl::StatusCode::kUnavailable) << i << ": " << got[i].status();
      EXPECT_TRUE(absl::StrContains(got[i].status().message(), "127.0.0.1")) << got[i].status();
    } else {
      ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
      EXPECT_EQ(**got[i], prefix.records.at(Bytes(prefix.hashes[i]))) << "block " << i;
    }
  }
}

// A large read that starts while another holds every connection is one
// stream: cutting it would only queue more streams on the same
// connections.
TEST(ShardSetFetch, AReadWhileOthersHoldEveryConnectionIsOneStream) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const LargePrefix prefix(40, rng.engine());
  RecordsByHash service(prefix.records, /*together=*/5);  // the first read's 4 streams wait for the second's
  OneShard shard(service, 4);
  ASSERT_NE(shard.shards, nullptr);
  auto read = [&] {
    for (const absl::StatusOr<SharedRecord>& r : shard.shards->Fetch("tenant", prefix.layout, prefix.hashes)) {
      EXPECT_TRUE(r.ok()) << r.status();
    }
  };
  std::thread first(read);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (service.calls().size() < 4 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(service.calls().size(), 4u) << "the first read was not cut into 4 streams";
  read();
  first.join();
  EXPECT_TRUE(service.all_arrived());
  EXPECT_EQ(service.calls().size(), 5u) << "the second read was cut while every connection was busy";
}

// A shard that failed its health check holds none of its blocks, but the
// prefix still ends at the first block any shard lacks: here the first
// block, on a live shard that does not hold it, not the down shard's.
TEST(ShardSetMatch, ADownShardBoundsThePrefixWithoutHidingAnEarlierMiss) {
  grpc::EnableDefaultHealthCheckService(true);
  StandInCache live_cache({});  // answers Match UNIMPLEMENTED: holds nothing
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(live_cache, port);
  ASSERT_NE(server, nullptr);
  const std::string live = "127.0.0.1:" + std::to_string(port), down = "127.0.0.1:1";
  auto shards = ShardSet::Create(live + "," + down, absl::Seconds(5), /*fast_path=*/false);
  ASSERT_TRUE(shards.ok()) << shards.status();
  (*shards)->CheckHealth();
  ASSERT_EQ((*shards)->HealthOfShards()[1], std::pair(down, ShardSet::Health::kDown));
  // The live shard's block first, the down shard's after it.
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::vector<kvblock::BlockHash> chain;
  while (chain.size() < 2) {
    kvblock::BlockHash h;
    for (auto& b : h) b = static_cast<uint8_t>(rng.engine()());
    if ((*shards)->ShardOf(h) == (chain.empty() ? live : down)) chain.push_back(h);
  }
  EXPECT_EQ((*shards)->MatchPrefix("ns", Layout(), chain), 0u);
}

}  // namespace
}  // namespace kvtier::cache
