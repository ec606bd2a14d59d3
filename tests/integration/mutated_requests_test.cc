// "A server never crashes on a client's bytes": valid requests to every RPC
// of the real kvtier-cache, kvtier-decode and kvtier-prefill binaries, with
// random bytes flipped, overwritten, cut off or inserted, sent as raw gRPC
// messages (so what the server parses is exactly what was mangled). Every
// answer must be OK (where the mangled request still means something) or a
// status that names the client's mistake, and bytes that no longer parse
// INVALID_ARGUMENT; afterwards the servers still hold and serve what they
// held.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/support/sync_stream.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <random>
#include <thread>
#include <tuple>

#include "kvtier/v1/decode.grpc.pb.h"
#include "kvtier/v1/prefill.grpc.pb.h"
#include "services/base/child_process.h"
#include "services/base/metrics_page.h"
#include "services/cache/client/cache_client.h"
#include "services/kvblock/block_key.h"
#include "services/rpc/client_identity.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model_config.h"
#include "services/serving/sequence_blocks.h"
#include "tests/integration/cache_test_blocks.h"
#include "tests/integration/cluster.h"
#include "tests/integration/mangled_messages.h"
#include "tests/test_random.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;
using grpc::StatusCode;
using testing::Mangled;

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

// What answers may be: OK or a status that names the client's mistake;
// never UNKNOWN, INTERNAL or UNAVAILABLE (a crash). Bytes that do not parse
// as the request must be INVALID_ARGUMENT (every server's interceptor, or
// the cache's own parse for Get and Put). Tallied for the log: by RPC,
// parsed or not, and code.
class Answers {
 public:
  void Check(const std::string& rpc, bool parses, const grpc::Status& status) {
    ++count_[{rpc, parses, status.error_code()}];
    if (!parses) {
      EXPECT_EQ(status.error_code(), StatusCode::INVALID_ARGUMENT) << rpc << ": " << status.error_message();
      return;
    }
    switch (status.error_code()) {
      case StatusCode::OK:
      case StatusCode::INVALID_ARGUMENT:
      case StatusCode::NOT_FOUND:
      case StatusCode::FAILED_PRECONDITION:
      case StatusCode::OUT_OF_RANGE:
      case StatusCode::DATA_LOSS:
      case StatusCode::RESOURCE_EXHAUSTED:
      case StatusCode::PERMISSION_DENIED:
        return;
      default:
        ADD_FAILURE() << rpc << " answered " << status.error_code() << ": " << status.error_message();
    }
  }
  ~Answers() {
    std::string line = "answers (rpc, parsed?, code) x count:";
    for (const auto& [key, n] : count_) {
      const auto& [rpc, parses, code] = key;
      line += " (" + rpc + (parses ? ", yes, " : ", no, ") + std::to_string(code) + ")x" + std::to_string(n);
    }
    std::cout << line << std::endl;
  }

 private:
  std::map<std::tuple<std::string, bool, int>, int> count_;
};

template <typename Message>
bool Parses(const std::string& bytes) {
  Message m;
  return m.ParseFromString(bytes);
}

grpc::Status Unary(grpc::Channel& channel, const std::string& method, const std::string& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::ByteBuffer response;
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      &channel, grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::NORMAL_RPC), &context,
      Bytes(request), &response);
}

grpc::Status ServerStreaming(grpc::Channel& channel, const std::string& method, const std::string& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          &channel, grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::SERVER_STREAMING), &context,
          Bytes(request)));
  grpc::ByteBuffer answer;
  while (reader->Read(&answer)) {
  }
  return reader->Finish();
}

grpc::Status ClientStreaming(grpc::Channel& channel, const std::string& method,
                             const std::vector<std::string>& requests) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::ByteBuffer response;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          &channel, grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::CLIENT_STREAMING), &context,
          &response));
  for (const std::string& r : requests) {
    if (!writer->Write(Bytes(r))) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

std::string Serialized(const google::protobuf::Message& m) { return m.SerializeAsString(); }

TEST(MutatedRequestsTest, CacheAnswersEveryMangledRequestAndKeepsItsBlocks) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  ChildProcess server({KVTIER_CACHE_BINARY, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                       "--device-capacity", "16MiB", "--host-capacity", "32MiB"});
  const int port = server.WaitForListeningPort();
  ASSERT_GT(port, 0);
  auto channel = MakeChannel("127.0.0.1:" + std::to_string(port));
  cache::CacheClient client(channel);
  const kvblock::LatentLayout layout = cache::TestLayout();

  // Blocks that must survive, and valid requests about them.
  std::vector<cache::TestBlock> kept;
  for (uint64_t i = 0; i < 3; ++i) kept.push_back(cache::MakeBlock(layout, "ns", rng.engine()()));
  for (const auto& b : kept) ASSERT_TRUE(client.Put("ns", layout, {b.slices}).ok());
  std::vector<kvblock::BlockHash> hashes;
  for (const auto& b : kept) hashes.push_back(b.slices.hash);
  // Pinned by a lease against the fresh blocks below; a second lease is
  // what the mangled ReleaseLease requests name (one may still end it).
  absl::StatusOr<v1::MatchResponse> leased = client.Match("ns", layout, hashes, /*acquire_lease=*/true, 60000);
  ASSERT_TRUE(leased.ok()) << leased.status();
  absl::StatusOr<v1::MatchResponse> to_release = client.Match("ns", layout, hashes, true, 60000);
  ASSERT_TRUE(to_release.ok()) << to_release.status();

  v1::MatchRequest match;
  match.set_kv_namespace("ns");
  *match.mutable_layout() = kvblock::LayoutToProto(layout);
  for (const auto& h : hashes) match.add_block_hashes(std::string(kvblock::HashAsBytes(h)));
  match.set_acquire_lease(true);
  match.set_lease_ttl_ms(2000);
  v1::GetRequest get = cache::MakeGetRequest("ns", layout, hashes);
  get.set_lease_id(leased->lease_id());
  v1::ReleaseLeaseRequest release;
  release.set_lease_id(to_release->lease_id());
  v1::OpenFastPathRequest open;
  open.set_staging_bytes(1 << 20);
  open.set_host_boot_id("boot");
  v1::LeaseBlocksRequest lease_blocks;
  lease_blocks.set_session_id(rng.engine()());
  lease_blocks.set_kv_namespace("ns");
  *lease_blocks.mutable_layout() = kvblock::LayoutToProto(layout);
  for (const auto& h : hashes) lease_blocks.add_block_hashes(std::string(kvblock::HashAsBytes(h)));

  // A Put message that is not a PutRequest is refused, not taken for the
  // end of the stream.
  {
    v1::PutRequest header;
    header.mutable_header()->set_kv_namespace("ns");
    *header.mutable_header()->mutable_layout() = kvblock::LayoutToProto(layout);
    const grpc::Status status =
        ClientStreaming(*channel, "/kvtier.v1.KvCache/Put", {Serialized(header), "\xff\xff\xff"});
    EXPECT_EQ(status.error_code(), StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(status.error_message(), "Put message 2 does not parse as a PutRequest");
  }
  // gRPC refuses a unary request that does not parse before any handler;
  // the servers' interceptor makes that a clear INVALID_ARGUMENT.
  {
    const grpc::Status status = Unary(*channel, "/kvtier.v1.KvCache/Match", "\xff\xff\xff");
    EXPECT_EQ(status.error_code(), StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(status.error_message(),
              "the request to /kvtier.v1.KvCache/Match does not parse as that method's request message");
  }

  // Meanwhile another client stores and reads back its own blocks: every
  // byte as written, whatever the mangled requests beside it do.
  std::atomic<bool> mangling{true};
  std::atomic<int> round_trips{0};
  std::thread valid_traffic([&, seed = rng.engine()()] {
    cache::CacheClient own(MakeChannel("127.0.0.1:" + std::to_string(port), Connection::kOwn));
    for (uint64_t k = 0; mangling.load() || k < 5; ++k) {
      const cache::TestBlock b = cache::MakeBlock(layout, "valid", seed + k);
      ASSERT_TRUE(own.Put("valid", layout, {b.slices}).ok());
      absl::StatusOr<std::vector<cache::FetchedBlock>> back = own.Get("valid", layout, {b.slices.hash});
      ASSERT_TRUE(back.ok()) << back.status();
      ASSERT_TRUE((*back)[0].status.ok()) << (*back)[0].status;
      ASSERT_EQ((*back)[0].record, b.record);
      ++round_trips;
    }
  });

  Answers answers;
  std::mt19937_64& r = rng.engine();
  for (int i = 0; i < 400; ++i) {
    const auto unary = [&]<typename Request>(const std::string& rpc, const Request& valid) {
      const std::string bytes = Mangled(valid, r);
      answers.Check(rpc, Parses<Request>(bytes), Unary(*channel, "/kvtier.v1.KvCache/" + rpc, bytes));
    };
    unary("Match", match);
    unary("ReleaseLease", release);
    unary("Stats", v1::StatsRequest());
    unary("OpenFastPath", open);
    unary("LeaseBlocks", lease_blocks);
    const std::string get_bytes = Mangled(get, r);
    answers.Check("Get", Parses<v1::GetRequest>(get_bytes),
                  ServerStreaming(*channel, "/kvtier.v1.KvCache/Get", get_bytes));
    // A Put of a fresh block, one of its messages mangled.
    const cache::TestBlock fresh = cache::MakeBlock(layout, "ns", r());
    std::vector<v1::PutRequest> messages(1);
    messages[0].mutable_header()->set_kv_namespace("ns");
    *messages[0].mutable_header()->mutable_layout() = kvblock::LayoutToProto(layout);
    for (const std::string& record : fresh.slices.records) {
      v1::LayerSlice* slice = messages.emplace_back().mutable_slice();
      slice->set_block_hash(std::string(kvblock::HashAsBytes(fresh.slices.hash)));
      slice->set_data(record);
    }
    const size_t victim = r() % messages.size();
    std::vector<std::string> put;
    for (size_t m = 0; m < messages.size(); ++m) {
      put.push_back(m == victim ? Mangled(messages[m], r) : Serialized(messages[m]));
    }
    answers.Check("Put", Parses<v1::PutRequest>(put[victim]), ClientStreaming(*channel, "/kvtier.v1.KvCache/Put", put));
  }

  mangling = false;
  valid_traffic.join();
  EXPECT_GE(round_trips.load(), 5);

  // What was stored is still there, byte for byte; no Put is left half
  // assembled.
  absl::StatusOr<std::vector<cache::FetchedBlock>> got = client.Get("ns", layout, hashes);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < kept.size(); ++i) {
    ASSERT_TRUE((*got)[i].status.ok()) << (*got)[i].status;
    EXPECT_EQ((*got)[i].record, kept[i].record) << "block " << i;
  }
  absl::StatusOr<v1::StatsResponse> stats = client.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pending_blocks(), 0u);
}

// A tiny model's cache, decode worker and prefill node, and requests for
// them.
class ModelServersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(runtime::MakeModel(config_, dir_, 5).ok());
    cluster_ = std::make_unique<Cluster>(dir_, 1, 1);
    ASSERT_TRUE(cluster_->ok());
    decode_channel_ = MakeChannel(cluster_->decode_targets[0]);
    prefill_channel_ = MakeChannel(cluster_->prefill_target);
  }
  void TearDown() override {
    cluster_.reset();
    fs::remove_all(dir_);
  }

  // The layout the cluster's prefill node stores (bf16, kClusterBlock).
  kvblock::LatentLayout Layout() const {
    return serving::ModelLayout(config_, *serving::ModelId(dir_, config_.model_type), kernels::Codec::kBf16,
                                kClusterBlock);
  }

  // A Decode request for tokens 1, 2, 3 held as a tail of random latents
  // of magnitude up to `scale`.
  v1::DecodeRequest Decode(float scale, uint32_t max_new_tokens) {
    v1::DecodeRequest request;
    request.set_kv_namespace("default");
    *request.mutable_layout() = kvblock::LayoutToProto(Layout());
    for (uint32_t t : {1, 2, 3}) request.add_token_ids(t);
    request.mutable_tail()->set_token_count(3);
    std::vector<float> tail(3 * config_.num_hidden_layers * (config_.kv_lora_rank + config_.qk_rope_head_dim));
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (float& v : tail) v = scale * value(rng_.engine());
    request.mutable_tail()->set_latents(std::string(reinterpret_cast<const char*>(tail.data()), tail.size() * 4));
    request.mutable_limits()->set_max_new_tokens(max_new_tokens);
    return request;
  }

  // A Decode request as a prefill node sends one: a block and 4 tokens of
  // prompt, the block inline (its key in block_hashes), the 4 tokens as the
  // tail, latents computed by the model in process.
  v1::DecodeRequest DecodeWithInlineBlock() {
    auto checkpoint = runtime::Checkpoint::Open(dir_);
    auto model = runtime::Model::Load(**checkpoint);
    const kvblock::LatentLayout layout = Layout();
    runtime::SequenceCache cache = (*model)->NewCache(layout.codec, layout.tokens_per_block);
    std::vector<uint32_t> prompt(kClusterBlock + 4);
    for (uint32_t& t : prompt) t = static_cast<uint32_t>(rng_.engine()() % config_.vocab_size);
    std::vector<float> logits(config_.vocab_size);
    EXPECT_TRUE((*model)->Prefill(prompt, cache, logits).ok());
    v1::DecodeRequest request;
    request.set_kv_namespace("default");
    *request.mutable_layout() = kvblock::LayoutToProto(layout);
    for (uint32_t t : prompt) request.add_token_ids(t);
    for (const auto& h : kvblock::ComputeBlockChain("default", kvblock::LayoutId(layout), kClusterBlock, prompt)) {
      request.add_block_hashes(std::string(kvblock::HashAsBytes(h)));
    }
    v1::InlineBlock* block = request.add_inline_blocks();
    block->set_block_index(0);
    block->set_data(*serving::BlockRecord(layout, cache, 0, 0, layout.num_layers));
    request.mutable_tail()->set_token_count(4);
    request.mutable_tail()->set_latents(serving::TailBytes(cache));
    request.mutable_first_token()->set_token_id(7);
    request.mutable_limits()->set_max_new_tokens(4);
    request.set_skip_write_back(rng_.engine()() % 2 == 0);
    return request;
  }

  testing::SeededRng rng_;
  const runtime::ModelConfig config_ = *runtime::PresetConfig("tiny");
  const std::string dir_ = (fs::temp_directory_path() / ("kvtier_mutated_" + std::to_string(getpid()))).string();
  std::unique_ptr<Cluster> cluster_;
  std::shared_ptr<grpc::Channel> decode_channel_, prefill_channel_;
};

TEST_F(ModelServersTest, DecodeAndPrefillAnswerEveryMangledRequestAndStillGenerate) {
  SCOPED_TRACE(rng_.Trace());
  // A generation before and after the mangled requests, both reading the
  // prompt's blocks from the cache: the same tokens. (The first one, which
  // stores them, attends over its own unrounded latents and may differ by a
  // near tie.)
  v1::GenerateRequest generate;
  generate.set_request_id("mutated");
  for (uint32_t t = 0; t < kClusterBlock + 16; ++t)
    generate.add_prompt_token_ids(1 + static_cast<uint32_t>(rng_.engine()() % 200));
  generate.mutable_limits()->set_max_new_tokens(6);
  auto generation = [&] {
    auto stub = v1::Prefill::NewStub(prefill_channel_);
    grpc::ClientContext context;
    auto reader = stub->Generate(&context, generate);
    std::vector<uint32_t> ids;
    v1::GenerateResponse e;
    while (reader->Read(&e)) {
      if (e.has_token()) ids.push_back(e.token().token_id());
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return ids;
  };
  ASSERT_EQ(generation().size(), 6u);
  const std::vector<uint32_t> before = generation();

  const v1::DecodeRequest requests[] = {Decode(1.0f, 4), DecodeWithInlineBlock()};
  for (const v1::DecodeRequest& request : requests) {
    const grpc::Status status = ServerStreaming(*decode_channel_, "/kvtier.v1.Decode/Decode", Serialized(request));
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  // Meanwhile the same generation runs again and again, its decode steps
  // batched with whatever the mangled requests started: always the same
  // tokens.
  std::atomic<bool> mangling{true};
  std::atomic<int> repeats{0};
  std::thread beside([&] {
    while (mangling.load() || repeats.load() < 3) {
      EXPECT_EQ(generation(), before) << "repeat " << repeats.load();
      ++repeats;
    }
  });
  Answers answers;
  for (int i = 0; i < 300; ++i) {
    const std::string decode_bytes = Mangled(requests[i % 2], rng_.engine());
    answers.Check("Decode", Parses<v1::DecodeRequest>(decode_bytes),
                  ServerStreaming(*decode_channel_, "/kvtier.v1.Decode/Decode", decode_bytes));
    const std::string generate_bytes = Mangled(generate, rng_.engine());
    answers.Check("Generate", Parses<v1::GenerateRequest>(generate_bytes),
                  ServerStreaming(*prefill_channel_, "/kvtier.v1.Prefill/Generate", generate_bytes));
  }
  mangling = false;
  beside.join();
  std::cout << repeats.load() << " generations ran beside the mangled requests" << std::endl;
  EXPECT_EQ(generation(), before);
}

// Latents finite but far out of range (a tail of values near the float
// maximum) overflow inside the model. The decode worker batches every
// sequence's step: the sequence at fault must fail alone (INVALID_ARGUMENT),
// and one decoding beside it must go on to the same tokens as without it.
TEST_F(ModelServersTest, ASequenceWhoseLatentsOverflowFailsAloneNotItsBatch) {
  SCOPED_TRACE(rng_.Trace());
  auto stub = v1::Decode::NewStub(decode_channel_);
  constexpr uint32_t kTokens = 1000;  // long enough for the bad one to join
  const v1::DecodeRequest good = Decode(1.0f, kTokens);
  auto tokens_of = [](grpc::ClientReader<v1::DecodeResponse>& reader, std::vector<uint32_t>& ids) {
    v1::DecodeResponse e;
    while (reader.Read(&e)) {
      if (e.has_token()) ids.push_back(e.token().token_id());
    }
    return reader.Finish();
  };
  std::vector<uint32_t> alone;
  {
    grpc::ClientContext context;
    auto reader = stub->Decode(&context, good);
    ASSERT_TRUE(tokens_of(*reader, alone).ok());
  }
  ASSERT_EQ(alone.size(), kTokens - 1);  // indexes 1 on: the prefill node samples 0

  // The bad sequence joins while the good one decodes.
  grpc::ClientContext good_context;
  auto good_reader = stub->Decode(&good_context, good);
  v1::DecodeResponse first;
  ASSERT_TRUE(good_reader->Read(&first));
  grpc::ClientContext bad_context;
  auto bad_reader = stub->Decode(&bad_context, Decode(3e38f, kTokens));
  std::vector<uint32_t> bad_ids;
  const grpc::Status bad = tokens_of(*bad_reader, bad_ids);
  EXPECT_EQ(bad.error_code(), StatusCode::INVALID_ARGUMENT) << bad.error_message();
  EXPECT_NE(bad.error_message().find("this sequence alone"), std::string::npos) << bad.error_message();
  std::vector<uint32_t> beside{first.token().token_id()};
  const grpc::Status status = tokens_of(*good_reader, beside);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(beside, alone);

  // They did share a step (else this tested nothing): a step of 2.
  const std::string page = ScrapeMetrics(cluster_->decode_metrics[0]);
  ASSERT_FALSE(page.empty());
  auto value = [&](const std::string& name) { return MetricValue(page, name).value_or(-1.0); };
  EXPECT_GT(value("kvtier_decode_batch_size_count"), value("kvtier_decode_batch_size_bucket{le=\"1\"}"));
}

}  // namespace
}  // namespace kvtier
