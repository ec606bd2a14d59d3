// "A server never crashes on a client's bytes": valid requests to every RPC
// of the real kvtier-cache, kvtier-decode and kvtier-prefill binaries, with
// random bytes flipped, overwritten, cut off or inserted, sent as raw gRPC
// messages (so what the server parses is exactly what was mangled). Every
// answer must be a status that names the client's mistake (or OK, where the
// mangled request still means something), never UNKNOWN or a server error
// other than gRPC's own "cannot parse"; afterwards the servers still hold
// and serve what they held.
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/support/sync_stream.h>

#include <filesystem>
#include <map>
#include <random>
#include <tuple>

#include "kvtier/v1/decode.grpc.pb.h"
#include "kvtier/v1/prefill.grpc.pb.h"
#include "services/cache/cache_client.h"
#include "services/common/child_process.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model_config.h"
#include "services/serving/sequence_blocks.h"
#include "tests/integration/cache_test_blocks.h"
#include "tests/test_random.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;
using grpc::StatusCode;

// 1-4 random edits of a serialized message.
std::string Mutate(std::string s, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 5) {
      case 0:  // one bit
        if (!s.empty()) s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8)));
        break;
      case 1:  // one byte
        if (!s.empty()) s[at] = static_cast<char>(rng());
        break;
      case 2:  // cut off
        s.resize(rng() % (s.size() + 1));
        break;
      case 3:  // bytes inserted
        for (size_t n = 1 + rng() % 8; n > 0; --n) s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), static_cast<char>(rng()));
        break;
      case 4:  // all ones: lengths and varints at their largest
        for (size_t i = at; i < std::min(s.size(), at + 1 + rng() % 8); ++i) s[i] = '\xff';
        break;
    }
  }
  return s;
}

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
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::ByteBuffer response;
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      &channel, grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::NORMAL_RPC), &context,
      Bytes(request), &response);
}

grpc::Status ServerStreaming(grpc::Channel& channel, const std::string& method, const std::string& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          &channel, grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::SERVER_STREAMING),
          &context, Bytes(request)));
  grpc::ByteBuffer answer;
  while (reader->Read(&answer)) {
  }
  return reader->Finish();
}

grpc::Status ClientStreaming(grpc::Channel& channel, const std::string& method,
                             const std::vector<std::string>& requests) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::ByteBuffer response;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          &channel, grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::CLIENT_STREAMING),
          &context, &response));
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
  auto channel = cache::CacheClient::Connect("127.0.0.1:" + std::to_string(port));
  cache::CacheClient client(channel);
  const kvblock::LatentLayout layout = cache::TestLayout();

  // Blocks that must survive, and valid requests about them.
  std::vector<cache::TestBlock> kept;
  for (uint64_t i = 0; i < 3; ++i) kept.push_back(cache::MakeBlock(layout, "ns", rng.engine()()));
  for (const auto& b : kept) ASSERT_TRUE(client.Put("ns", layout, {b.slices}).ok());
  std::vector<kvblock::BlockHash> hashes;
  for (const auto& b : kept) hashes.push_back(b.slices.hash);
  absl::StatusOr<v1::MatchResponse> leased = client.Match("ns", layout, hashes, /*acquire_lease=*/true, 60000);
  ASSERT_TRUE(leased.ok()) << leased.status();

  v1::MatchRequest match;
  match.set_kv_namespace("ns");
  *match.mutable_layout() = kvblock::LayoutToProto(layout);
  for (const auto& h : hashes) match.add_block_hashes(std::string(kvblock::HashAsBytes(h)));
  match.set_acquire_lease(true);
  match.set_lease_ttl_ms(2000);
  v1::GetRequest get = cache::MakeGetRequest("ns", layout, hashes);
  get.set_lease_id(leased->lease_id());
  v1::ReleaseLeaseRequest release;
  release.set_lease_id(leased->lease_id());
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

  Answers answers;
  std::mt19937_64& r = rng.engine();
  for (int i = 0; i < 400; ++i) {
    const auto unary = [&]<typename Request>(const std::string& rpc, const Request& valid) {
      const std::string bytes = Mutate(Serialized(valid), r);
      answers.Check(rpc, Parses<Request>(bytes), Unary(*channel, "/kvtier.v1.KvCache/" + rpc, bytes));
    };
    unary("Match", match);
    unary("ReleaseLease", release);
    unary("Stats", v1::StatsRequest());
    unary("OpenFastPath", open);
    unary("LeaseBlocks", lease_blocks);
    const std::string get_bytes = Mutate(Serialized(get), r);
    answers.Check("Get", Parses<v1::GetRequest>(get_bytes),
                  ServerStreaming(*channel, "/kvtier.v1.KvCache/Get", get_bytes));
    // A Put of a fresh block, one of its messages mangled.
    const cache::TestBlock fresh = cache::MakeBlock(layout, "ns", r());
    std::vector<std::string> put;
    v1::PutRequest header;
    header.mutable_header()->set_kv_namespace("ns");
    *header.mutable_header()->mutable_layout() = kvblock::LayoutToProto(layout);
    put.push_back(Serialized(header));
    for (const std::string& record : fresh.slices.records) {
      v1::PutRequest slice;
      slice.mutable_slice()->set_block_hash(std::string(kvblock::HashAsBytes(fresh.slices.hash)));
      slice.mutable_slice()->set_data(record);
      put.push_back(Serialized(slice));
    }
    std::string& victim = put[r() % put.size()];
    victim = Mutate(std::move(victim), r);
    answers.Check("Put", Parses<v1::PutRequest>(victim), ClientStreaming(*channel, "/kvtier.v1.KvCache/Put", put));
  }

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

TEST(MutatedRequestsTest, DecodeAndPrefillAnswerEveryMangledRequestAndStillGenerate) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const std::string dir = (fs::temp_directory_path() / ("kvtier_mutated_" + std::to_string(getpid()))).string();
  const runtime::ModelConfig config = *runtime::PresetConfig("tiny");
  ASSERT_TRUE(runtime::MakeModel(config, dir, 5).ok());
  struct Cleanup {
    std::string dir;
    ~Cleanup() { fs::remove_all(dir); }
  } cleanup{dir};

  ChildProcess cache({KVTIER_CACHE_BINARY, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                      "--device-capacity", "16MiB", "--host-capacity", "16MiB"});
  const std::string cache_target = "127.0.0.1:" + std::to_string(cache.WaitForListeningPort());
  ChildProcess decode({KVTIER_DECODE_BINARY, "--listen", "127.0.0.1:0", "--model", dir, "--cache", cache_target,
                       "--metrics-listen", "127.0.0.1:0"});
  const int decode_port = decode.WaitForListeningPort();
  ASSERT_GT(decode_port, 0);
  const std::string decode_target = "127.0.0.1:" + std::to_string(decode_port);
  ChildProcess prefill({KVTIER_PREFILL_BINARY, "--listen", "127.0.0.1:0", "--model", dir, "--cache", cache_target,
                        "--decode", decode_target, "--kv-codec", "bf16", "--tokens-per-block", "16",
                        "--metrics-listen", "127.0.0.1:0"});
  const int prefill_port = prefill.WaitForListeningPort();
  ASSERT_GT(prefill_port, 0);
  auto decode_channel = cache::CacheClient::Connect(decode_target);
  auto prefill_channel = cache::CacheClient::Connect("127.0.0.1:" + std::to_string(prefill_port));

  // A generation before and after the mangled requests, both reading the
  // prompt's blocks from the cache: the same tokens. (The first one, which
  // stores them, attends over its own unrounded latents and may differ by a
  // near tie.)
  v1::GenerateRequest generate;
  generate.set_request_id("mutated");
  for (uint32_t t = 0; t < 40; ++t) generate.add_prompt_token_ids(1 + static_cast<uint32_t>(rng.engine()() % 200));
  generate.mutable_limits()->set_max_new_tokens(6);
  auto generation = [&] {
    auto stub = v1::Prefill::NewStub(prefill_channel);
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

  const kvblock::LatentLayout layout =
      serving::ModelLayout(config, *serving::ModelId(dir), kernels::Codec::kBf16, 16);
  v1::DecodeRequest request;
  request.set_kv_namespace("default");
  *request.mutable_layout() = kvblock::LayoutToProto(layout);
  for (uint32_t t : {1, 2, 3}) request.add_token_ids(t);
  request.mutable_tail()->set_token_count(3);
  const size_t tail_floats = 3 * config.num_hidden_layers * (config.kv_lora_rank + config.qk_rope_head_dim);
  std::vector<float> tail(tail_floats);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (float& v : tail) v = value(rng.engine());
  request.mutable_tail()->set_latents(std::string(reinterpret_cast<const char*>(tail.data()), tail.size() * 4));
  request.mutable_limits()->set_max_new_tokens(4);
  ASSERT_TRUE(ServerStreaming(*decode_channel, "/kvtier.v1.Decode/Decode", Serialized(request)).ok());

  Answers answers;
  for (int i = 0; i < 300; ++i) {
    const std::string decode_bytes = Mutate(Serialized(request), rng.engine());
    answers.Check("Decode", Parses<v1::DecodeRequest>(decode_bytes),
                  ServerStreaming(*decode_channel, "/kvtier.v1.Decode/Decode", decode_bytes));
    const std::string generate_bytes = Mutate(Serialized(generate), rng.engine());
    answers.Check("Generate", Parses<v1::GenerateRequest>(generate_bytes),
                  ServerStreaming(*prefill_channel, "/kvtier.v1.Prefill/Generate", generate_bytes));
  }
  EXPECT_EQ(generation(), before);
}

}  // namespace
}  // namespace kvtier
