// The cache's device tier on a GPU (--device-memory cuda; ctest label
// `gpu`): a client that can open CUDA IPC handles gets the blocks of that
// tier device to device, through a buffer of its own session; and blocks
// pushed down to the host tier (its pages pinned for the GPU's copies) and
// read back up come back as they were stored. Skipped, saying why, where
// there is no GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kvtier/kernels/cuda_codec.h"
#include "services/base/child_process.h"
#include "services/cache/client/shard_set.h"
#include "services/cache/fast_path/fast_path_client.h"
#include "services/rpc/client_identity.h"
#include "tests/binary_path.h"
#include "tests/integration/cache_test_blocks.h"
#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

class FastPathGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!kernels::cuda::DevicePresent(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
  // A kvtier-cache on a free port, its device tier on the GPU.
  void StartCache(const std::string& device_capacity, const std::string& host_capacity) {
    cache_ = std::make_unique<ChildProcess>(std::vector<std::string>{
        testing::BinaryPath("KVTIER_CACHE_BINARY", KVTIER_CACHE_BINARY), "--listen", "127.0.0.1:0", "--metrics-listen",
        "", "--device-capacity", device_capacity, "--host-capacity", host_capacity, "--device-memory", "cuda"});
    const int port = cache_->WaitForListeningPort();
    ASSERT_GT(port, 0);
    target_ = "127.0.0.1:" + std::to_string(port);
  }

  std::unique_ptr<ChildProcess> cache_;
  std::string target_;
};

TEST_F(FastPathGpuTest, GpuTierBlocksReachAGpuClientThroughIpc) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  ASSERT_NO_FATAL_FAILURE(StartCache("256MiB", "256MiB"));
  const kvblock::LatentLayout layout = TestLayout();
  CacheClient client(MakeChannel(target_));
  std::vector<TestBlock> blocks;
  std::vector<BlockSlices> slices;
  std::vector<kvblock::BlockHash> hashes;
  for (int i = 0; i < 24; ++i) {
    blocks.push_back(MakeBlock(layout, "tenant-a", rng.seed() + i));
    slices.push_back(blocks.back().slices);
    hashes.push_back(blocks.back().slices.hash);
  }
  ASSERT_TRUE(client.Put("tenant-a", layout, slices).ok());

  auto fast = FastPathClient::Connect(MakeChannel(target_), absl::Seconds(10), 0, 64 << 20);
  ASSERT_TRUE(fast.ok()) << fast.status();
  ASSERT_TRUE((*fast)->has_device_staging()) << "granted on proof, its handle over the socket";
  EXPECT_EQ(client.Stats()->fast_path_device_staging_bytes(), uint64_t{64} << 20);
  std::vector<std::string> records(blocks.size());
  size_t delivered = 0;
  auto left = (*fast)->Fetch(
      "tenant-a", layout, hashes,
      [&](uint32_t i, size_t size) {
        records[i].resize(size);
        return std::span(reinterpret_cast<uint8_t*>(records[i].data()), size);
      },
      [&](const RawBlock& b) { delivered += b.status.ok(); });
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->empty()) << "every block came through the device staging";
  EXPECT_EQ(delivered, blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) EXPECT_EQ(records[i], blocks[i].record) << i;
  EXPECT_EQ(client.Stats()->fast_path_blocks_out(), blocks.size());
  // The shard set (decode and prefill) takes the same way.
  auto shards = cache::ShardSet::Create(target_, absl::Seconds(10), /*fast_path=*/true);
  ASSERT_TRUE(shards.ok());
  const auto fetched = (*shards)->Fetch("tenant-a", layout, hashes);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(fetched[i].ok()) << fetched[i].status();
    EXPECT_EQ(**fetched[i], blocks[i].record) << i;
  }
}

// Four times what the GPU tier holds, so most blocks go down to the host
// tier and are promoted again when read: each read back byte for byte.
TEST_F(FastPathGpuTest, BlocksSpilledToTheHostTierComeBackUpIntact) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  ASSERT_NO_FATAL_FAILURE(StartCache("4MiB", "64MiB"));
  const kvblock::LatentLayout layout = TestLayout();  // 13 blocks hold 4 MiB
  CacheClient client(MakeChannel(target_));
  std::vector<TestBlock> blocks;
  std::vector<kvblock::BlockHash> hashes;
  for (int i = 0; i < 48; ++i) {
    blocks.push_back(MakeBlock(layout, "tenant-a", rng.seed() + i));
    hashes.push_back(blocks.back().slices.hash);
    ASSERT_TRUE(client.Put("tenant-a", layout, {blocks.back().slices}).ok()) << i;
  }
  const auto got = client.Get("tenant-a", layout, hashes);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), blocks.size());
  size_t from_host = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE((*got)[i].status.ok()) << i << ": " << (*got)[i].status;
    EXPECT_EQ((*got)[i].record, blocks[i].record) << i;
    from_host += (*got)[i].tier == v1::TIER_HOST;
  }
  EXPECT_GT(from_host, blocks.size() / 2);
  const auto stats = client.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->checksum_failures(), 0u);
  EXPECT_GT(stats->tiers(0).demotions(), blocks.size() / 2);
  EXPECT_GT(stats->tiers(0).promotions(), 0u);
}

}  // namespace
}  // namespace kvtier::cache
