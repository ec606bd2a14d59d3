// ShardSet::Fetch over TCP checks each record as it lands. A real
// kvtier-cache never sends a record that fails its CRC (it checks on every
// read), so bytes damaged on the way can only come from a stand-in: a
// KvCache server here that answers Get with chosen records, one of them
// with a flipped byte, one of another layout.
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include <random>

#include "kvtier/v1/cache.grpc.pb.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/block_key.h"
#include "services/serving/shard_set.h"
#include "tests/test_random.h"

namespace kvtier::serving {
namespace {

kvblock::LatentLayout Layout() {
  return {.model_id = "fetch-test", .num_layers = 3, .kv_lora_rank = 32, .rope_dim = 8, .tokens_per_block = 16,
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

  StandInCache service(sent);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto shards = ShardSet::Create("127.0.0.1:" + std::to_string(port), absl::Seconds(10), /*fast_path=*/false);
  ASSERT_TRUE(shards.ok()) << shards.status();
  std::vector<std::uint32_t> tokens(layout.tokens_per_block * records.size());
  for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<uint32_t>(t);
  const std::vector<kvblock::BlockHash> hashes =
      kvblock::ComputeBlockChain("tenant", kvblock::LayoutId(layout), layout.tokens_per_block, tokens);
  const std::vector<absl::StatusOr<SharedRecord>> got = (*shards)->Fetch("tenant", layout, hashes);
  ASSERT_EQ(got.size(), records.size());
  for (size_t i : {0, 2}) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    EXPECT_EQ(**got[i], records[i]);
    EXPECT_TRUE(kvblock::ParseBlock(**got[i], &layout).ok());
  }
  EXPECT_EQ(got[1].status().code(), absl::StatusCode::kDataLoss) << got[1].status();
  EXPECT_FALSE(got[3].ok());
  server->Shutdown();
}

}  // namespace
}  // namespace kvtier::serving
