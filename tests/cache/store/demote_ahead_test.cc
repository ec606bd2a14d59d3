// StoreOptions::demote_ahead: a tier with one below keeps room free by
// demoting on the store's own thread, coldest first, so a Put into a full
// device tier finds room without demoting; nothing is lost while the tier
// below has room, and pinned blocks stay where they are.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "services/base/clock.h"
#include "services/cache/store/block_store.h"
#include "services/cache/store/slab_memory.h"
#include "services/kvblock/block_format.h"
#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

using kvblock::BlockHash;

constexpr uint32_t kPage = 4096;
constexpr uint64_t kDevicePages = 128;  // room ahead: 128 / 64 = 2 pages

kvblock::LatentLayout Layout() {  // 2,340-byte records: one page each
  return {.model_id = "demote-ahead-test",
          .num_layers = 4,
          .kv_lora_rank = 24,
          .rope_dim = 8,
          .tokens_per_block = 16,
          .codec = kernels::Codec::kInt8};
}

TEST(RoomAhead, IsA64thOfTheTierAtMostAQuarterOfTheOneBelow) {
  EXPECT_EQ(StoreOptions::RoomAhead(64 << 20, 1 << 30), 1u << 20);
  EXPECT_EQ(StoreOptions::RoomAhead(uint64_t{1} << 30, 16 << 20), 4u << 20);
  EXPECT_EQ(StoreOptions::RoomAhead(uint64_t{1} << 30, 4096), 1024u);
}

// The device tier in host memory, or in a slab reached by copies (a GPU's,
// which demotes a batch at a time).
class DemoteAheadTest : public ::testing::TestWithParam<bool> {
 protected:
  void Open(bool demote_ahead, uint64_t host_pages, uint64_t disk_records = 0) {
    StoreOptions o;
    o.page_size = kPage;
    o.device_capacity = kDevicePages * kPage;
    o.host_capacity = host_pages * kPage;
    o.eviction = Eviction::kLru;
    o.demote_ahead = demote_ahead;
    if (disk_records > 0) {
      o.disk_dir = disk_dir_.string();
      o.disk_capacity = disk_records * kvblock::HeaderFor(layout_, 0, layout_.num_layers).RecordBytes();
    }
    if (GetParam()) {
      slab_ = *StagedHostSlab::Create(o.device_capacity);
      o.device_slab = slab_;
    }
    store_.reset();
    auto s = BlockStore::Create(o, &clock_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }

  BlockHash Hash(int i) {
    std::vector<uint32_t> tokens(16, static_cast<uint32_t>(i));
    return kvblock::ChainHash("ns", kvblock::kNoParent, layout_id_, tokens);
  }

  // Puts block i whole, fresh random latents; returns its record.
  std::string Put(int i) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(size_t{layout_.num_layers} * layout_.LayerShape().values());
    for (float& v : x) v = normal(rng_.engine());
    absl::StatusOr<std::string> record = kvblock::EncodeBlock(layout_, 0, layout_.num_layers, x);
    EXPECT_TRUE(record.ok()) << record.status();
    auto session = store_->BeginPut("ns", layout_);
    EXPECT_TRUE(session->AddSlice(Hash(i), *record).ok());
    EXPECT_TRUE(session->Finish().incomplete.empty());
    return *record;
  }

  // Put, then waits until the thread has kept the room ahead, so that every
  // move is the thread's: a Put that found a tier full (the thread slow on
  // a busy machine) would demote itself; a tier below then holds blocks in
  // the order two demoters delivered them, and the thread, finding that
  // Put's blocks pinned, rests a while short of its room (as when stuck).
  std::string PutAfterRoomAhead(int i) {
    std::string record = Put(i);
    store_->WaitForRoomAhead();
    return record;
  }

  TierKind TierOf(int i) {
    const BlockHash hash = Hash(i);
    MatchResult m = store_->Match("ns", layout_id_, std::span(&hash, 1));
    EXPECT_EQ(m.matched_blocks, 1u) << "block " << i << " lost";
    return m.matched_blocks == 1 ? m.tiers[0] : TierKind::kDisk;
  }

  uint64_t DeviceFreePages() {
    const TierCounters device = store_->Stats().tiers[0];
    return (device.capacity_bytes - device.used_bytes) / kPage;
  }

  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(disk_dir_);
  }

  ManualClock clock_;
  testing::SeededRng rng_;
  std::filesystem::path disk_dir_ =
      std::filesystem::temp_directory_path() / ("kvtier_demote_ahead_test_" + std::to_string(rng_.seed()));
  kvblock::LatentLayout layout_ = Layout();
  uint64_t layout_id_ = kvblock::LayoutId(Layout());
  std::shared_ptr<SlabMemory> slab_;
  std::unique_ptr<BlockStore> store_;
};

TEST_P(DemoteAheadTest, KeepsRoomFreeByDemotingTheColdestBlocks) {
  SCOPED_TRACE(rng_.Trace());
  Open(/*demote_ahead=*/true, /*host_pages=*/64);
  std::vector<std::string> records;
  for (int i = 0; i < int{kDevicePages}; ++i) records.push_back(Put(i));
  store_->WaitForRoomAhead();
  EXPECT_GE(DeviceFreePages(), 2u);
  StoreStats s = store_->Stats();
  EXPECT_GE(s.tiers[0].demotions_ahead, 2u);
  EXPECT_LE(s.tiers[0].demotions_ahead, s.tiers[0].demotions);
  EXPECT_EQ(s.tiers[1].evictions, 0u) << "the host tier had room for every block";
  // Coldest first: the first blocks stored went down, the newest stayed.
  EXPECT_EQ(TierOf(0), TierKind::kHost);
  EXPECT_EQ(TierOf(1), TierKind::kHost);
  EXPECT_EQ(TierOf(kDevicePages - 1), TierKind::kDevice);
  for (int i = 0; i < int{kDevicePages}; ++i) {
    absl::StatusOr<std::shared_ptr<const PinnedBlock>> read = store_->Read("ns", layout_id_, Hash(i));
    ASSERT_TRUE(read.ok()) << i << ": " << read.status();
    EXPECT_EQ((*read)->CopyToString(), records[i]) << i;
  }
}

// Once room is kept ahead, a Put into the full tier takes it and leaves
// every demotion to the store's thread; without demote_ahead the Puts
// demote themselves.
TEST_P(DemoteAheadTest, APutIntoAFullTierDoesNotDemote) {
  for (const bool ahead : {true, false}) {
    SCOPED_TRACE(ahead ? "demote ahead" : "on demand");
    Open(ahead, /*host_pages=*/64);
    for (int i = 0; i < int{kDevicePages}; ++i) Put(i);
    store_->WaitForRoomAhead();
    const uint64_t free_before = DeviceFreePages(), demotions_before = store_->Stats().tiers[0].demotions;
    constexpr int kMore = 16;
    for (int i = 0; i < kMore; ++i) {
      Put(int{kDevicePages} + i);
      store_->WaitForRoomAhead();
      const StoreStats s = store_->Stats();
      EXPECT_EQ(s.tiers[0].demotions_ahead, ahead ? s.tiers[0].demotions : 0u) << i;
      if (ahead) {
        EXPECT_GE(DeviceFreePages(), 2u) << i;
      }
    }
    EXPECT_GE(store_->Stats().tiers[0].demotions, demotions_before + kMore - free_before);
  }
}

// Leased blocks stay where they are: the thread waits, drops nothing, and
// goes on once the lease ends.
TEST_P(DemoteAheadTest, LeavesPinnedBlocksAndGoesOnWhenTheyAreReleased) {
  Open(/*demote_ahead=*/true, /*host_pages=*/64);
  constexpr int kStored = kDevicePages - 2;  // the room ahead still free: nothing moves
  std::vector<BlockHash> hashes;
  for (int i = 0; i < kStored; ++i) {
    Put(i);
    hashes.push_back(Hash(i));
  }
  store_->WaitForRoomAhead();
  ASSERT_EQ(store_->Stats().tiers[0].demotions, 0u);
  MatchResult lease = store_->Match("ns", layout_id_, hashes, absl::Seconds(5));
  ASSERT_EQ(lease.matched_blocks, uint32_t{kStored});
  ASSERT_NE(lease.lease_id, 0u);
  // A block being assembled takes a page and is no one's to move: the
  // tier is short of its room ahead with nothing the thread may take.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(layout_.LayerShape().values());
  for (float& v : x) v = normal(rng_.engine());
  auto session = store_->BeginPut("ns", layout_);
  ASSERT_TRUE(session->AddSlice(Hash(kStored), *kvblock::EncodeBlock(layout_, 0, 1, x)).ok());
  store_->WaitForRoomAhead();
  EXPECT_EQ(DeviceFreePages(), 1u);
  StoreStats s = store_->Stats();
  EXPECT_EQ(s.tiers[0].demotions, 0u) << "a leased block moved";
  EXPECT_EQ(s.tiers[0].evictions + s.tiers[1].evictions, 0u);
  ASSERT_TRUE(store_->ReleaseLease(lease.lease_id).ok());
  // The thread looks again within its retry: room comes back.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (DeviceFreePages() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_GE(DeviceFreePages(), 2u);
  s = store_->Stats();
  EXPECT_GE(s.tiers[0].demotions_ahead, 1u);
  EXPECT_EQ(s.tiers[0].evictions + s.tiers[1].evictions, 0u);
  EXPECT_EQ(TierOf(0), TierKind::kHost) << "the coldest went first";
  session.reset();  // its incomplete block dropped
}

// A full tier below evicts its coldest to take what comes down: the store
// then holds the room ahead (and a slab's batch) less than both tiers.
TEST_P(DemoteAheadTest, HoldsTheRoomAheadLessWhenEveryTierIsFull) {
  Open(/*demote_ahead=*/true, /*host_pages=*/8);  // room ahead: min(128 / 64, 8 / 4) = 2 pages
  constexpr int kBlocks = kDevicePages + 32;
  for (int i = 0; i < kBlocks; ++i) PutAfterRoomAhead(i);
  const StoreStats s = store_->Stats();
  const uint64_t held = s.tiers[0].blocks + s.tiers[1].blocks, most = kDevicePages + 8 - 2;
  const uint64_t batch = GetParam() ? 8 : 1;  // a slab of 128 pages moves a 16th at a time
  EXPECT_LE(held, most);
  EXPECT_GE(held, most - (batch - 1));
  EXPECT_EQ(s.tiers[0].evictions + s.tiers[1].evictions, kBlocks - held) << "every block stored is held or evicted";
  EXPECT_EQ(TierOf(kBlocks - 1), TierKind::kDevice);
}

// With a disk tier the host tier keeps its room ahead too, its coldest
// written to disk on the same thread; every block reads back intact.
TEST_P(DemoteAheadTest, TheHostTierKeepsRoomAheadOfTheDisk) {
  Open(/*demote_ahead=*/true, /*host_pages=*/64, /*disk_records=*/256);  // host room ahead: one page
  constexpr int kBlocks = kDevicePages + 64;
  std::vector<std::string> records;
  for (int i = 0; i < kBlocks; ++i) records.push_back(PutAfterRoomAhead(i));
  const StoreStats s = store_->Stats();
  EXPECT_GE(DeviceFreePages(), 2u);
  EXPECT_GE(s.tiers[1].capacity_bytes - s.tiers[1].used_bytes, uint64_t{kPage});
  EXPECT_GE(s.tiers[1].demotions_ahead, 1u);
  EXPECT_EQ(s.tiers[0].evictions + s.tiers[1].evictions + s.tiers[2].evictions, 0u);
  EXPECT_EQ(TierOf(0), TierKind::kDisk) << "the coldest went furthest";
  for (int i = 0; i < kBlocks; ++i) {
    absl::StatusOr<std::shared_ptr<const PinnedBlock>> read = store_->Read("ns", layout_id_, Hash(i));
    ASSERT_TRUE(read.ok()) << i << ": " << read.status();
    EXPECT_EQ((*read)->CopyToString(), records[i]) << i;
  }
}

// Above a tier of three pages the room ahead is under a page: none is kept,
// and the device tier fills as without demote_ahead.
TEST_P(DemoteAheadTest, KeepsNoRoomAheadOfUnderAPage) {
  Open(/*demote_ahead=*/true, /*host_pages=*/3);
  for (int i = 0; i < int{kDevicePages}; ++i) Put(i);
  store_->WaitForRoomAhead();
  EXPECT_EQ(DeviceFreePages(), 0u);
  EXPECT_EQ(store_->Stats().tiers[0].demotions, 0u);
}

INSTANTIATE_TEST_SUITE_P(Memory, DemoteAheadTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("StagedDevice") : std::string("Private");
                         });

}  // namespace
}  // namespace kvtier::cache
