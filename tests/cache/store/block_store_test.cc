// BlockStore with a hand-driven clock: visibility, dedup, LRU demotion and
// promotion, leases, pins, capacity limits, checksums, namespaces, the
// disk tier. Over 600 lines: one fixture, run over every kind of memory.
#include "services/cache/store/block_store.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "services/cache/store/disk_dir.h"
#include "services/kvblock/block_format.h"
#include "tests/cache/store/gated_pin_slab.h"
#include "tests/cache/store/recording_slab.h"
#include "tests/test_random.h"
#include "tests/v4_records.h"

namespace kvtier::cache {
namespace {

using kvblock::BlockHash;

constexpr uint32_t kPage = 4096;

kvblock::LatentLayout SmallLayout() {  // 2,340-byte records: one page each
  return {.model_id = "store-test",
          .num_layers = 4,
          .kv_lora_rank = 24,
          .rope_dim = 8,
          .tokens_per_block = 16,
          .codec = kernels::Codec::kInt8};
}

// Where the tiers live. Every behaviour must be the same in each.
enum class Memory {
  kPrivate,         // anonymous host memory
  kSharedSegments,  // memfd segments of two pages, one namespace each
  kStagedDevice,    // the device tier in a slab reached only by copies (as a GPU's)
};

class BlockStoreTest : public ::testing::TestWithParam<Memory> {
 protected:
  void SetUp() override { Open(4, 6); }

  // Capacities in pages (one block per page with SmallLayout); disk in
  // records.
  void Open(uint64_t device_pages, uint64_t host_pages, uint64_t disk_records = 0,
            const std::function<void(StoreOptions&)>& tune = {}) {
    StoreOptions o;
    o.page_size = kPage;
    o.device_capacity = device_pages * kPage;
    o.host_capacity = host_pages * kPage;
    o.shared_memory = GetParam() == Memory::kSharedSegments;
    o.segment_bytes = 2 * kPage;
    slab_.reset();
    if (GetParam() == Memory::kStagedDevice) {
      slab_ = *StagedHostSlab::Create(device_pages * kPage);
      o.device_slab = slab_;
    }
    if (disk_records > 0) {
      o.disk_dir = disk_dir_.string();
      o.disk_capacity = disk_records * kvblock::HeaderFor(layout_, 0, 4).RecordBytes();
    }
    store_.reset();
    o.default_lease_ttl = absl::Seconds(10);
    if (tune) tune(o);
    auto s = BlockStore::Create(o, &clock_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }

  BlockHash Hash(int i) {
    std::vector<uint32_t> tokens(16, static_cast<uint32_t>(i));
    return kvblock::ChainHash("ns", kvblock::kNoParent, layout_id_, tokens);
  }

  // Encodes fresh random latents for layers [begin, begin + count).
  std::string Slice(uint32_t begin, uint32_t count) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(size_t{count} * layout_.LayerShape().values());
    for (float& v : x) v = normal(rng_.engine());
    auto r = kvblock::EncodeBlock(layout_, begin, count, x);
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  }

  // Puts a whole block layer by layer; returns the layers' records.
  std::vector<std::string> Put(const BlockHash& hash, const std::string& ns = "ns") {
    auto session = store_->BeginPut(ns, layout_);
    std::vector<std::string> slices;
    for (uint32_t l = 0; l < layout_.num_layers; ++l) {
      slices.push_back(Slice(l, 1));
      absl::Status s = session->AddSlice(hash, slices.back());
      EXPECT_TRUE(s.ok()) << s;
    }
    PutSummary summary = session->Finish();
    EXPECT_TRUE(summary.incomplete.empty());
    return slices;
  }

  // Puts whole blocks through one session, in order (as a prefill node's
  // stream stores a prompt's new blocks).
  void PutChain(const std::vector<BlockHash>& hashes, bool cold_start = false) {
    auto session = store_->BeginPut("ns", layout_, "", {}, cold_start);
    for (const BlockHash& hash : hashes) {
      for (uint32_t l = 0; l < layout_.num_layers; ++l) {
        absl::Status s = session->AddSlice(hash, Slice(l, 1));
        EXPECT_TRUE(s.ok()) << s;
      }
    }
    EXPECT_TRUE(session->Finish().incomplete.empty());
  }

  // Puts block Hash(i) as `owner` under `quota`: the first slice's error.
  absl::Status PutAs(const std::string& owner, const OwnerQuota& quota, int i) {
    auto session = store_->BeginPut("ns", layout_, owner, quota);
    absl::Status status;
    for (uint32_t l = 0; l < layout_.num_layers && status.ok(); ++l) status = session->AddSlice(Hash(i), Slice(l, 1));
    session->Finish();
    return status;
  }

  bool Held(const BlockHash& hash) { return store_->Match("ns", layout_id_, std::span(&hash, 1)).matched_blocks == 1; }

  // Rounds of a hot block H used again, then `one_offs` new blocks never
  // used again, in a store with room for five (four in the device tier,
  // one in the host tier): whether H was still there at each round's start.
  std::vector<bool> HotBlockAmongOneOffs(int rounds, int one_offs) {
    const BlockHash hot = Hash(1000);
    std::vector<bool> found;
    for (int round = 0; round < rounds; ++round) {
      found.push_back(Held(hot));
      if (!found.back()) {
        Put(hot);
        EXPECT_TRUE(Held(hot));  // used once stored
      }
      std::vector<BlockHash> fresh;
      for (int i = 0; i < one_offs; ++i) fresh.push_back(Hash(2000 + round * one_offs + i));
      PutChain(fresh);
    }
    return found;
  }

  // That `hash` reads back (by `how`) as the layers Put stored as `slices`.
  void ExpectStored(const BlockHash& hash, const std::vector<std::string>& slices, const BlockStore::ReadOptions& how) {
    auto block = store_->Read("ns", layout_id_, hash, how);
    ASSERT_TRUE(block.ok()) << kvblock::HashToHex(hash) << ": " << block.status();
    const std::string record = (*block)->CopyToString();
    auto view = kvblock::ParseBlock(record, &layout_);
    ASSERT_TRUE(view.ok()) << view.status();
    for (uint32_t l = 0; l < slices.size(); ++l) {
      EXPECT_EQ(view->Layer(l), kvblock::ParseBlock(slices[l])->Layer(0)) << kvblock::HashToHex(hash) << "/" << l;
    }
  }

  absl::StatusCode ReadCode(const BlockHash& hash, const std::string& ns = "ns") {
    return store_->Read(ns, layout_id_, hash).status().code();
  }

  std::optional<TierKind> TierOf(const BlockHash& hash) {
    MatchResult m = store_->Match("ns", layout_id_, std::span(&hash, 1));
    return m.matched_blocks == 1 ? std::optional<TierKind>(m.tiers[0]) : std::nullopt;
  }

  void ConcurrentTraffic();

  void ExpectWithinCapacity() {
    for (const TierCounters& t : store_->Stats().tiers) {
      EXPECT_LE(t.used_bytes, t.capacity_bytes) << static_cast<int>(t.tier);
    }
  }

  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(disk_dir_);
  }

  // Simulates a memory fault under the store: flips one byte of the block's
  // record where it is stored (in its pages, or in the device slab), in the
  // tier it is in (read without promoting it).
  void Corrupt(const BlockHash& hash, size_t at) {
    BlockStore::ReadOptions in_place;
    in_place.promote = false;
    auto block = store_->Read("ns", layout_id_, hash, in_place);
    ASSERT_TRUE(block.ok()) << block.status();
    if (slab_ == nullptr || (*block)->tier() != TierKind::kDevice) {
      *const_cast<uint8_t*>((*block)->pieces()[0].data() + at) ^= 0x10;
      return;
    }
    // In the slab: find the page holding the record (one page each here).
    const std::string record = (*block)->CopyToString();
    std::string page(record.size(), '\0');
    for (uint64_t offset = 0; offset + kPage <= slab_->size(); offset += kPage) {
      ASSERT_TRUE(slab_->CopyOut(offset, page.data(), page.size()).ok());
      if (page != record) continue;
      const uint8_t flipped = static_cast<uint8_t>(record[at] ^ 0x10);
      ASSERT_TRUE(slab_->CopyIn(offset + at, &flipped, 1).ok());
      return;
    }
    FAIL() << "record not found in the slab";
  }

  testing::SeededRng rng_;
  std::shared_ptr<StagedHostSlab> slab_;  // kStagedDevice
  std::filesystem::path disk_dir_ =
      std::filesystem::temp_directory_path() / ("kvtier_store_test_" + std::to_string(rng_.seed()));
  ManualClock clock_;
  kvblock::LatentLayout layout_ = SmallLayout();
  uint64_t layout_id_ = kvblock::LayoutId(SmallLayout());
  std::unique_ptr<BlockStore> store_;
};

TEST_P(BlockStoreTest, ReadsBackTheRecordAssembledFromSlices) {
  SCOPED_TRACE(rng_.Trace());
  const BlockHash h = Hash(1);
  auto slices = Put(h);
  auto block = store_->Read("ns", layout_id_, h);
  ASSERT_TRUE(block.ok()) << block.status();
  const std::string record = (*block)->CopyToString();
  absl::StatusOr<kvblock::BlockView> view = kvblock::ParseBlock(record, &layout_);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->header.layer_count, 4u);
  for (uint32_t l = 0; l < 4; ++l) {
    auto slice = kvblock::ParseBlock(slices[l], &layout_);
    ASSERT_TRUE(slice.ok());
    EXPECT_EQ(view->Layer(l), slice->Layer(0)) << "layer " << l;
  }
  EXPECT_EQ((*block)->tier(), TierKind::kDevice);
}

// Cuts `record` at random places into pieces (some empty), as a message
// lies in gRPC's receive buffers.
std::vector<std::span<const uint8_t>> RandomPieces(const std::string& record, std::mt19937_64& rng) {
  std::vector<std::span<const uint8_t>> pieces;
  const auto* bytes = reinterpret_cast<const uint8_t*>(record.data());
  size_t at = 0;
  while (at < record.size()) {
    const size_t n = std::uniform_int_distribution<size_t>(0, std::min<size_t>(record.size() - at, 97))(rng);
    pieces.emplace_back(bytes + at, n);
    at += n;
  }
  return pieces;
}

// A slice whose record lies in pieces is stored as the same slice whole
// would be; a flipped payload byte in any piece is DATA_LOSS.
TEST_P(BlockStoreTest, SlicesInPiecesAssembleTheSameBlock) {
  SCOPED_TRACE(rng_.Trace());
  const BlockHash whole = Hash(1), pieced = Hash(2);
  auto a = store_->BeginPut("ns", layout_);
  auto b = store_->BeginPut("ns", layout_);
  for (uint32_t l = 0; l < layout_.num_layers; ++l) {
    const std::string slice = Slice(l, 1);
    ASSERT_TRUE(a->AddSlice(whole, slice).ok());
    std::string damaged = slice;
    const size_t header = kvblock::HeaderFor(layout_, l, 1).HeaderBytes();
    damaged[std::uniform_int_distribution<size_t>(header, slice.size() - 5)(rng_.engine())] ^= 0x04;
    EXPECT_EQ(b->AddSlice(pieced, RandomPieces(damaged, rng_.engine())).code(), absl::StatusCode::kDataLoss);
    ASSERT_TRUE(b->AddSlice(pieced, RandomPieces(slice, rng_.engine())).ok());
  }
  EXPECT_TRUE(a->Finish().incomplete.empty());
  EXPECT_TRUE(b->Finish().incomplete.empty());
  auto x = store_->Read("ns", layout_id_, whole);
  auto y = store_->Read("ns", layout_id_, pieced);
  ASSERT_TRUE(x.ok() && y.ok());
  const std::string record = (*y)->CopyToString();
  EXPECT_EQ(record, (*x)->CopyToString());
  EXPECT_TRUE(kvblock::ParseBlock(record, &layout_).ok());
}

TEST_P(BlockStoreTest, BlockIsInvisibleUntilItsLastLayerArrivesInAnyOrder) {
  const BlockHash h = Hash(2);
  auto session = store_->BeginPut("ns", layout_);
  ASSERT_TRUE(session->AddSlice(h, Slice(2, 2)).ok());  // layers 2-3 first
  EXPECT_EQ(store_->Match("ns", layout_id_, std::span(&h, 1)).matched_blocks, 0u);
  EXPECT_EQ(ReadCode(h), absl::StatusCode::kNotFound);
  ASSERT_TRUE(session->AddSlice(h, Slice(0, 1)).ok());
  EXPECT_EQ(ReadCode(h), absl::StatusCode::kNotFound);
  ASSERT_TRUE(session->AddSlice(h, Slice(1, 1)).ok());
  EXPECT_EQ(ReadCode(h), absl::StatusCode::kOk);
  EXPECT_EQ(session->Finish().blocks_stored, 1u);
}

TEST_P(BlockStoreTest, SecondPutOfAStoredBlockIsDeduplicated) {
  const BlockHash h = Hash(3);
  Put(h);
  const uint64_t used = store_->Stats().tiers[0].used_bytes;
  auto session = store_->BeginPut("ns", layout_);
  for (uint32_t l = 0; l < 4; ++l) ASSERT_TRUE(session->AddSlice(h, Slice(l, 1)).ok());
  PutSummary summary = session->Finish();
  EXPECT_EQ(summary.blocks_stored, 0u);
  EXPECT_EQ(summary.blocks_deduplicated, 1u);
  const StoreStats stats = store_->Stats();
  EXPECT_EQ(stats.tiers[0].used_bytes, used);
  EXPECT_EQ(stats.blocks_deduplicated, 1u);
  EXPECT_EQ(stats.blocks_stored, 1u);
}

// One stream, or one tenant's streams, cannot hold every block being
// assembled: past their bound a new block is RESOURCE_EXHAUSTED for them
// alone, and completing a block gives its place back.
TEST_P(BlockStoreTest, IncompleteBlocksAreBoundedPerStreamAndPerOwner) {
  Open(16, 16, 0, [](StoreOptions& o) {
    o.max_pending_per_stream = 3;
    o.max_pending_per_owner = 5;
  });
  auto hoarder = store_->BeginPut("ns", layout_, "mallory");
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(hoarder->AddSlice(Hash(10 + i), Slice(0, 1)).ok());
  absl::Status refused = hoarder->AddSlice(Hash(13), Slice(0, 1));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("one stream"), std::string::npos) << refused;
  auto second = store_->BeginPut("ns", layout_, "mallory");
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(second->AddSlice(Hash(20 + i), Slice(0, 1)).ok());
  refused = second->AddSlice(Hash(22), Slice(0, 1));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("one tenant"), std::string::npos) << refused;
  // A tenant's quota of bytes in flight bounds its streams together too.
  auto metered = store_->BeginPut("ns", layout_, "carol", OwnerQuota{{}, 2 * kPage});
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(metered->AddSlice(Hash(40 + i), Slice(0, 1)).ok());
  refused = metered->AddSlice(Hash(42), Slice(0, 1));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("carol's Put streams hold"), std::string::npos) << refused;
  metered.reset();
  // Another tenant is not held up.
  auto honest = store_->BeginPut("ns", layout_, "alice");
  for (uint32_t l = 0; l < 4; ++l) ASSERT_TRUE(honest->AddSlice(Hash(30), Slice(l, 1)).ok());
  EXPECT_EQ(honest->Finish().blocks_stored, 1u);
  // A block completed frees its place in its stream's and tenant's bounds.
  for (uint32_t l = 1; l < 4; ++l) ASSERT_TRUE(hoarder->AddSlice(Hash(10), Slice(l, 1)).ok());
  EXPECT_TRUE(hoarder->AddSlice(Hash(13), Slice(0, 1)).ok());
  hoarder.reset();
  second.reset();
  EXPECT_EQ(store_->Stats().pending_blocks, 0u);
}

// Tenants together are bounded too: the store assembles at most
// max_pending_blocks at once, and a completed block frees its place.
TEST_P(BlockStoreTest, IncompleteBlocksAreBoundedForTheWholeStore) {
  Open(16, 16, 0, [](StoreOptions& o) { o.max_pending_blocks = 4; });
  std::vector<std::unique_ptr<PutSession>> streams;
  for (int i = 0; i < 4; ++i) {
    streams.push_back(store_->BeginPut("ns", layout_, absl::StrCat("tenant-", i)));
    ASSERT_TRUE(streams.back()->AddSlice(Hash(10 + i), Slice(0, 1)).ok()) << i;
  }
  auto late = store_->BeginPut("ns", layout_, "tenant-4");
  const absl::Status refused = late->AddSlice(Hash(14), Slice(0, 1));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("the limit"), std::string::npos) << refused;
  for (uint32_t l = 1; l < 4; ++l) ASSERT_TRUE(streams[0]->AddSlice(Hash(10), Slice(l, 1)).ok());
  EXPECT_TRUE(late->AddSlice(Hash(14), Slice(0, 1)).ok());
}

// Without a quota of bytes in flight, one owner's incomplete blocks take at
// most half the device tier however few and big they are (here a page
// each, four streams of one): the rest stays for others, and for its own
// blocks once it completes some.
TEST_P(BlockStoreTest, IncompleteBlocksOfAnOwnerWithoutAQuotaTakeHalfTheDeviceTierAtMost) {
  Open(8, 8);  // one block a page
  std::vector<std::unique_ptr<PutSession>> streams;
  for (int i = 0; i < 4; ++i) {
    streams.push_back(store_->BeginPut("ns", layout_, "mallory"));
    ASSERT_TRUE(streams.back()->AddSlice(Hash(10 + i), Slice(0, 1)).ok()) << i;
  }
  auto fifth = store_->BeginPut("ns", layout_, "mallory");
  const absl::Status refused = fifth->AddSlice(Hash(14), Slice(0, 1));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("without a putBytesInFlight quota"), std::string::npos) << refused;
  auto honest = store_->BeginPut("ns", layout_, "alice");
  for (uint32_t l = 0; l < layout_.num_layers; ++l) ASSERT_TRUE(honest->AddSlice(Hash(30), Slice(l, 1)).ok());
  EXPECT_EQ(honest->Finish().blocks_stored, 1u);
  for (uint32_t l = 1; l < layout_.num_layers; ++l) ASSERT_TRUE(streams[0]->AddSlice(Hash(10), Slice(l, 1)).ok());
  EXPECT_TRUE(fifth->AddSlice(Hash(14), Slice(0, 1)).ok());
}

// Quotas: a tenant writing ten times its quota demotes and drops its own
// blocks, never another's within its quota; use counts whole pages and each
// block's bookkeeping; a Put that cannot fit because the tenant's quota is
// all pinned says so.
TEST_P(BlockStoreTest, ATenantOverItsQuotaEvictsOnlyItsOwnBlocks) {
  Open(8, 8);  // one block a page
  constexpr uint64_t kCharged = kPage + kBookkeepingBytesPerBlock;
  // alice's quota: two pages, which two blocks' bookkeeping overflows.
  const OwnerQuota small{{2 * kPage, 2 * kPage, 0}}, fair{{3 * kCharged, 3 * kCharged, 0}};
  const auto put = [&](const std::string& owner, const OwnerQuota& quota, int i) { return PutAs(owner, quota, i); };
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(put("bob", fair, 100 + i).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(put("alice", small, i).ok()) << i;
  StoreStats stats = store_->Stats();
  EXPECT_EQ(stats.used_by_owner["bob"][0], 3 * kCharged) << "bob's blocks, within his quota, left the device tier";
  EXPECT_EQ(stats.used_by_owner["alice"][0], kCharged) << "a block's bookkeeping is charged to its tenant";
  EXPECT_EQ(stats.used_by_owner["alice"][1], kCharged);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(store_->Match("ns", layout_id_, std::vector<BlockHash>{Hash(100 + i)}).tiers,
              std::vector<TierKind>{TierKind::kDevice})
        << "bob's block " << i;
  }
  // alice's newest blocks are what she keeps; the rest are gone.
  EXPECT_EQ(store_->Match("ns", layout_id_, std::vector<BlockHash>{Hash(19)}).matched_blocks, 1u);
  EXPECT_EQ(store_->Match("ns", layout_id_, std::vector<BlockHash>{Hash(0)}).matched_blocks, 0u);
  // The tier counts pages alone; the tenants also their blocks' bookkeeping.
  EXPECT_EQ(stats.tiers[0].used_bytes + stats.tiers[0].blocks * kBookkeepingBytesPerBlock,
            stats.used_by_owner["alice"][0] + stats.used_by_owner["bob"][0]);

  // Her device share all leased: a new block cannot fit, and says why.
  std::vector<BlockHash> hers;
  for (int i = 0; i < 20; ++i) {
    if (store_->Match("ns", layout_id_, std::vector<BlockHash>{Hash(i)}).tiers ==
        std::vector<TierKind>{TierKind::kDevice}) {
      hers.push_back(Hash(i));
    }
  }
  ASSERT_EQ(hers.size(), 1u);
  for (const BlockHash& h : hers) {
    ASSERT_NE(store_->Match("ns", layout_id_, std::vector<BlockHash>{h}, absl::Seconds(30), "alice").lease_id, 0u);
  }
  const absl::Status refused = put("alice", small, 50);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("alice's quota"), std::string::npos) << refused;
  EXPECT_TRUE(put("bob", fair, 103).ok()) << "bob's own room is not alice's";
}

// Free room a tenant's segments keep (its blocks evicted around those it
// holds) is room only it can use: in shared segments it is charged to it
// beyond one segment, which can put it over its quota, and then its blocks
// go before another tenant's own. Private pages have no such room.
TEST_P(BlockStoreTest, ATenantPaysForTheRoomItsSegmentsKeepFromOthers) {
  Open(8, 1);  // a block a page, segments of two pages
  const bool shared = GetParam() == Memory::kSharedSegments;
  constexpr uint64_t kCharged = kPage + kBookkeepingBytesPerBlock;
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(PutAs("alice", {}, i).ok());  // three segments, full
  std::vector<std::shared_ptr<const PinnedBlock>> read;                 // one block in each, held
  for (int i : {0, 2, 4}) read.push_back(*store_->Read("ns", layout_id_, Hash(i)));
  for (int i = 100; i < 105; ++i) ASSERT_TRUE(PutAs("bob", {}, i).ok());  // pushes out alice's others
  read.clear();
  StoreStats stats = store_->Stats();
  EXPECT_EQ(stats.tiers[0].segment_slack_bytes, shared ? 3 * kPage : 0);
  // Three pages free in her three segments, one segment's worth free of charge.
  EXPECT_EQ(stats.used_by_owner["alice"][0], 3 * kCharged + (shared ? kPage : 0));
  for (int i : {0, 2, 4}) ASSERT_EQ(TierOf(Hash(i)), TierKind::kDevice) << i;
  for (int i : {1, 3, 5}) ASSERT_NE(TierOf(Hash(i)), TierKind::kDevice) << i;
  std::vector<int> bobs;  // in the device tier, used after alice's
  for (int i = 100; i < 105; ++i) {
    if (TierOf(Hash(i)) == TierKind::kDevice) bobs.push_back(i);
  }

  // A quota her blocks fit, but not with that room: over it, her blocks
  // are the first to go when bob needs a page (within it, only his own
  // would go).
  const OwnerQuota quota{{3 * kCharged + kPage / 2, 0, 0}};
  store_->BeginPut("ns", layout_, "alice", quota)->Finish();
  ASSERT_TRUE(PutAs("bob", {}, 105).ok());
  if (shared) {
    EXPECT_NE(TierOf(Hash(0)), TierKind::kDevice) << "alice's oldest block stayed";
    for (int i : bobs) EXPECT_EQ(TierOf(Hash(i)), TierKind::kDevice) << "bob's block " << i << " left before hers";
  } else {  // no such room: she is within her quota, and his oldest goes
    for (int i : {0, 2, 4}) EXPECT_EQ(TierOf(Hash(i)), TierKind::kDevice) << i;
    EXPECT_NE(TierOf(Hash(bobs.front())), TierKind::kDevice);
  }
  ExpectWithinCapacity();
}

// A tenant's leases are bounded (its quota's number, or the store's):
// past it Match refuses the lease, and another tenant still gets one.
TEST_P(BlockStoreTest, LeasesAreBoundedPerOwner) {
  const BlockHash h = Hash(7);
  Put(h);
  const std::vector<BlockHash> one{h};
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(store_->Match("ns", layout_id_, one, absl::Seconds(5), "mallory", 2).lease_status.ok());
  }
  const MatchResult refused = store_->Match("ns", layout_id_, one, absl::Seconds(5), "mallory", 2);
  EXPECT_EQ(refused.lease_status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.lease_id, 0u);
  EXPECT_NE(store_->Match("ns", layout_id_, one, absl::Seconds(5), "alice", 2).lease_id, 0u);
}

TEST_P(BlockStoreTest, CancelledPutFreesWhatItHeld) {
  const StoreStats before = store_->Stats();
  {
    auto session = store_->BeginPut("ns", layout_);
    ASSERT_TRUE(session->AddSlice(Hash(4), Slice(0, 1)).ok());
    ASSERT_TRUE(session->AddSlice(Hash(5), Slice(3, 1)).ok());
    EXPECT_EQ(store_->Stats().pending_blocks, 2u);
    EXPECT_GT(store_->Stats().tiers[0].used_bytes, before.tiers[0].used_bytes);
  }  // stream cancelled
  const StoreStats after = store_->Stats();
  EXPECT_EQ(after.pending_blocks, 0u);
  EXPECT_EQ(after.tiers[0].used_bytes, before.tiers[0].used_bytes);
  EXPECT_EQ(ReadCode(Hash(4)), absl::StatusCode::kNotFound);

  auto session = store_->BeginPut("ns", layout_);
  ASSERT_TRUE(session->AddSlice(Hash(6), Slice(0, 1)).ok());
  PutSummary summary = session->Finish();
  ASSERT_EQ(summary.incomplete.size(), 1u);
  EXPECT_EQ(summary.incomplete[0], Hash(6));
  EXPECT_EQ(store_->Stats().tiers[0].used_bytes, before.tiers[0].used_bytes);
}

TEST_P(BlockStoreTest, BadSlicesGetTheirStatusAndLeaveTheSessionUsable) {
  auto session = store_->BeginPut("ns", layout_);
  const BlockHash h = Hash(7);
  ASSERT_TRUE(session->AddSlice(h, Slice(0, 2)).ok());
  EXPECT_EQ(session->AddSlice(h, Slice(1, 1)).code(), absl::StatusCode::kInvalidArgument);
  std::string corrupt = Slice(2, 1);
  corrupt[100] ^= 1;
  EXPECT_EQ(session->AddSlice(h, corrupt).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->Stats().arrival_checksum_failures, 1u);
  EXPECT_EQ(store_->Stats().checksum_failures, 0u) << "the sender's fault, not the store's";
  kvblock::LatentLayout other = layout_;
  other.codec = kernels::Codec::kInt4;
  std::vector<float> x(other.LayerShape().values(), 1.0f);
  EXPECT_EQ(session->AddSlice(h, *kvblock::EncodeBlock(other, 2, 1, x)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session->AddSlice(h, "garbage").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(session->AddSlice(h, Slice(2, 2)).ok());
  EXPECT_EQ(session->Finish().blocks_stored, 1u);
  EXPECT_EQ(ReadCode(h), absl::StatusCode::kOk);
}

TEST_P(BlockStoreTest, FullDeviceTierDemotesLruAndLastTierDrops) {
  // Device holds 4 blocks, host 6.
  for (int i = 0; i < 10; ++i) Put(Hash(i));
  StoreStats s = store_->Stats();
  EXPECT_EQ(s.tiers[0].blocks, 4u);
  EXPECT_EQ(s.tiers[1].blocks, 6u);
  EXPECT_EQ(s.tiers[0].demotions, 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(TierOf(Hash(i)), TierKind::kHost) << i;
  for (int i = 6; i < 10; ++i) EXPECT_EQ(TierOf(Hash(i)), TierKind::kDevice) << i;
  // Match touched 0..9 in order, so 6 is now the device tier's LRU block.
  Put(Hash(10));
  s = store_->Stats();
  EXPECT_EQ(s.tiers[1].evictions, 1u);
  EXPECT_EQ(TierOf(Hash(0)), std::nullopt) << "host LRU block dropped";
  EXPECT_EQ(TierOf(Hash(6)), TierKind::kHost) << "device LRU block demoted";
  ExpectWithinCapacity();
}

// A prefix matched and then pushed out by two new blocks (room for four
// in the device tier, one in the host tier): plain LRU gives up the
// prefix's first blocks, the oldest refreshed, and nothing of it can be
// matched; leaf-first gives up its last, and three of four still match.
TEST_P(BlockStoreTest, LeafFirstEvictionKeepsWhatIsLeftOfAPrefixMatchable) {
  for (const auto& [eviction, still_matched] : {std::pair{Eviction::kLru, 0u}, {Eviction::kLeafFirst, 3u}}) {
    Open(4, 1, 0, [&](StoreOptions& o) { o.eviction = eviction; });
    const std::vector<BlockHash> prefix = {Hash(0), Hash(1), Hash(2), Hash(3)};
    for (const BlockHash& h : prefix) Put(h);
    ASSERT_EQ(store_->Match("ns", layout_id_, prefix).matched_blocks, 4u);
    for (const BlockHash& h : prefix) EXPECT_EQ(ReadCode(h), absl::StatusCode::kOk);  // the Get after it
    Put(Hash(10));
    Put(Hash(11));
    EXPECT_EQ(store_->Stats().tiers[1].evictions, 1u);
    EXPECT_EQ(store_->Match("ns", layout_id_, prefix).matched_blocks, still_matched)
        << (eviction == Eviction::kLru ? "lru" : "leaf-first");
  }
}

// A client that reads a prefix without a Match (Read block by block,
// then Refresh, as the Get service does) keeps it under leaf-first as a
// matcher would: the reads alone leave it the oldest, to be pushed out.
TEST_P(BlockStoreTest, RefreshKeepsAReadOnlyPrefixUnderLeafFirst) {
  for (const bool refresh : {false, true}) {
    // Room for five blocks in the device tier and one in the host tier.
    Open(5, 1, 0, [&](StoreOptions& o) { o.eviction = Eviction::kLeafFirst; });
    const std::vector<BlockHash> prefix = {Hash(0), Hash(1), Hash(2), Hash(3)};
    for (const BlockHash& h : prefix) Put(h);
    Put(Hash(20));  // newer than the prefix, until the prefix is refreshed
    for (const BlockHash& h : prefix) EXPECT_EQ(ReadCode(h), absl::StatusCode::kOk);
    if (refresh) store_->Refresh("ns", layout_id_, prefix);
    Put(Hash(10));
    Put(Hash(11));
    EXPECT_EQ(store_->Match("ns", layout_id_, prefix).matched_blocks, refresh ? 4u : 0u)
        << (refresh ? "refreshed" : "read only");
  }
}

// A Put stream's new blocks of a prefix are ordered as a Match orders
// them: pushed out by two new blocks (room for four in the device tier,
// one in the host tier), leaf-first and adaptive give up the stream's last
// blocks and three of four still match; plain LRU gives up its first.
TEST_P(BlockStoreTest, AStreamsNewBlocksGoLastFirst) {
  for (const auto& [eviction, still_matched] :
       {std::pair{Eviction::kLru, 0u}, {Eviction::kLeafFirst, 3u}, {Eviction::kAdaptive, 3u}}) {
    Open(4, 1, 0, [&](StoreOptions& o) { o.eviction = eviction; });
    const std::vector<BlockHash> prefix = {Hash(0), Hash(1), Hash(2), Hash(3)};
    PutChain(prefix);
    Put(Hash(10));
    Put(Hash(11));
    EXPECT_EQ(store_->Stats().tiers[1].evictions, 1u);
    EXPECT_EQ(store_->Match("ns", layout_id_, prefix).matched_blocks, still_matched) << static_cast<int>(eviction);
  }
}

// A hot block used every round among six one-off blocks a round, with room
// for five: recency alone (lru, leaf-first) pushes it out every round.
// Adaptive starts as leaf-first, but the hot block stored again after
// recency evicted it shrinks the share blocks on probation may take, until
// the one-offs go first and the hot block stays.
TEST_P(BlockStoreTest, AdaptiveKeepsAReusedBlockThatLruDrops) {
  constexpr int kRounds = 8;
  for (const Eviction eviction : {Eviction::kLru, Eviction::kLeafFirst, Eviction::kAdaptive}) {
    Open(4, 1, 0, [&](StoreOptions& o) { o.eviction = eviction; });
    const std::vector<bool> found = HotBlockAmongOneOffs(kRounds, 6);
    const StoreStats stats = store_->Stats();
    if (eviction == Eviction::kAdaptive) {
      EXPECT_LT(stats.probation_share, 1.0) << "the hot block's returns moved it";
      EXPECT_GT(stats.tiers[0].probation_bytes, 0u) << "the last round's one-offs";
    } else {
      EXPECT_EQ(stats.probation_share, 1.0);
      EXPECT_EQ(stats.tiers[0].probation_bytes, 0u);
    }
    for (int round = 1; round < kRounds; ++round) {
      if (eviction != Eviction::kAdaptive) {
        EXPECT_FALSE(found[round]) << static_cast<int>(eviction) << " round " << round;
      } else if (round >= kRounds / 2) {
        EXPECT_TRUE(found[round]) << "adaptive, round " << round;
      }
    }
    ExpectWithinCapacity();
  }
}

// Three hot blocks used every round, and three new blocks a round, each
// used once right after it is stored (so off probation at once), with
// room for five: the newest are always the most recent, so recency gives
// up a hot block every round, and the next hot one before its turn comes.
// Adaptive learns from the hot blocks stored again after recency let them
// go: the room is scarce (used blocks lost, probation's share falls) and
// the hot ones are used far more often, so frequency's victims (the new
// blocks) go, and the hot blocks stay.
TEST_P(BlockStoreTest, AdaptiveKeepsBlocksUsedMostWhenTheyOutnumberTheRoom) {
  constexpr int kRounds = 16;
  for (const Eviction eviction : {Eviction::kLru, Eviction::kLeafFirst, Eviction::kAdaptive}) {
    Open(4, 1, 0, [&](StoreOptions& o) { o.eviction = eviction; });
    std::vector<int> hot_found;  // per round
    for (int round = 0; round < kRounds; ++round) {
      int found = 0;
      for (int hot = 0; hot < 3; ++hot) {
        if (Held(Hash(1000 + hot))) {  // a Match: used again
          ++found;
          continue;
        }
        Put(Hash(1000 + hot));
        ASSERT_TRUE(Held(Hash(1000 + hot)));  // used once stored
      }
      hot_found.push_back(found);
      for (int i = 0; i < 3; ++i) {
        const BlockHash fresh = Hash(2000 + 3 * round + i);
        Put(fresh);
        ASSERT_TRUE(Held(fresh));
      }
    }
    const StoreStats stats = store_->Stats();
    SCOPED_TRACE(static_cast<int>(eviction));
    if (eviction == Eviction::kAdaptive) {
      EXPECT_GT(stats.frequency_share, 0.0) << "the hot blocks' returns moved it";
      EXPECT_EQ(std::vector<int>(hot_found.end() - 4, hot_found.end()), std::vector<int>(4, 3)) << "all three kept";
    } else {
      EXPECT_EQ(stats.frequency_share, 0.0);
      EXPECT_EQ(std::count(hot_found.begin() + 1, hot_found.end(), 0), kRounds - 1) << "none found after the first";
    }
    ExpectWithinCapacity();
  }
}

// A block on probation that a reader holds is passed over, however far
// over its share probation is; the next oldest goes instead.
TEST_P(BlockStoreTest, AdaptiveLeavesAPinnedBlockOnProbationWhereItIs) {
  Open(4, 1, 0, [](StoreOptions& o) { o.eviction = Eviction::kAdaptive; });
  ASSERT_TRUE(HotBlockAmongOneOffs(8, 6).back()) << "the share did not move";
  const BlockHash kept = Hash(9000);
  Put(kept);                                            // new: on probation
  auto reading = store_->Read("ns", layout_id_, kept);  // a Read pins, and does not use it again
  ASSERT_TRUE(reading.ok());
  std::vector<BlockHash> fresh;
  for (int i = 0; i < 12; ++i) fresh.push_back(Hash(9100 + i));
  PutChain(fresh);
  EXPECT_EQ((*reading)->tier(), TierKind::kDevice);
  reading->reset();
  EXPECT_TRUE(Held(kept));
  EXPECT_TRUE(Held(Hash(1000))) << "the hot block";
  ExpectWithinCapacity();
}

// Of the blocks on probation, a cold start's (a Put whose client found
// none of the sequence's prefix cached) go first: after the share moved
// (the hot block among one-offs, room for five), a block W continuing a
// prefix, then a one-off prompt of six blocks. Marked cold, the one-off's
// blocks go and W stays; not marked, W, older, goes before them. Under
// leaf-first the mark changes nothing: W goes.
TEST_P(BlockStoreTest, AdaptiveLetsAColdStartGoFirst) {
  for (const Eviction eviction : {Eviction::kLeafFirst, Eviction::kAdaptive}) {
    for (const bool cold : {false, true}) {
      SCOPED_TRACE(std::string(eviction == Eviction::kAdaptive ? "adaptive" : "leaf-first") +
                   (cold ? ", cold start" : ", not marked"));
      Open(4, 1, 0, [&](StoreOptions& o) { o.eviction = eviction; });
      ASSERT_EQ(HotBlockAmongOneOffs(8, 6).back(), eviction == Eviction::kAdaptive);
      const BlockHash w = Hash(7000);
      PutChain({w});
      std::vector<BlockHash> one_off;
      for (int i = 0; i < 6; ++i) one_off.push_back(Hash(7100 + i));
      PutChain(one_off, cold);
      EXPECT_EQ(Held(w), eviction == Eviction::kAdaptive && cold);
      if (eviction == Eviction::kAdaptive) {
        EXPECT_TRUE(Held(Hash(1000))) << "the hot block";
      }
      ExpectWithinCapacity();
    }
  }
}

// Once everything stored is used again, adaptive gives up what leaf-first
// would: after the rounds above moved its share, blocks each used right
// after they are stored, and some used again later, are found or missed
// exactly as in a leaf-first store given the same requests, and the same
// are held at the end.
TEST_P(BlockStoreTest, AdaptiveFallsBackToLruWhenEverythingIsReused) {
  std::vector<bool> found[2];
  std::vector<BlockHash> held[2];
  for (const Eviction eviction : {Eviction::kLeafFirst, Eviction::kAdaptive}) {
    const bool adaptive = eviction == Eviction::kAdaptive;
    Open(4, 1, 0, [&](StoreOptions& o) { o.eviction = eviction; });
    if (adaptive) {
      ASSERT_TRUE(HotBlockAmongOneOffs(8, 6).back()) << "the share did not move";
    }
    std::mt19937_64 rng(rng_.seed());  // the same requests for both
    for (int i = 0; i < 40; ++i) {
      const BlockHash h = Hash(5000 + i);
      Put(h);
      ASSERT_TRUE(Held(h));
      if (i % 2 == 1) {  // one of the six before it, used again (or stored again)
        const BlockHash again = Hash(5000 + i - 1 - static_cast<int>(rng() % std::min(6, i)));
        found[adaptive].push_back(Held(again));
        if (!found[adaptive].back()) {  // stored again, and used at once as every block here
          Put(again);
          ASSERT_TRUE(Held(again));
        }
      }
    }
    for (int i = 0; i < 40; ++i) {
      if (Held(Hash(5000 + i))) held[adaptive].push_back(Hash(5000 + i));
    }
    EXPECT_EQ(held[adaptive].size(), 5u);
  }
  EXPECT_EQ(found[0], found[1]);
  EXPECT_EQ(held[0], held[1]);
  EXPECT_GT(std::count(found[0].begin(), found[0].end(), true), 0);
  EXPECT_GT(std::count(found[0].begin(), found[0].end(), false), 0);
}

TEST_P(BlockStoreTest, ReadPromotesADemotedBlock) {
  for (int i = 0; i < 6; ++i) Put(Hash(i));
  ASSERT_EQ(TierOf(Hash(0)), TierKind::kHost);
  auto block = store_->Read("ns", layout_id_, Hash(0));
  ASSERT_TRUE(block.ok());
  EXPECT_EQ((*block)->tier(), TierKind::kHost) << "reports where it was found";
  block->reset();
  EXPECT_EQ(TierOf(Hash(0)), TierKind::kDevice);
  const StoreStats s = store_->Stats();
  EXPECT_EQ(s.tiers[0].promotions, 1u);
  EXPECT_EQ(s.tiers[1].hits, 1u);
  EXPECT_EQ(s.tiers[0].blocks + s.tiers[1].blocks, 6u);
}

TEST_P(BlockStoreTest, LeasedBlocksSurvivePressureUntilTheLeaseExpires) {
  Open(2, 2);
  Put(Hash(0));
  Put(Hash(1));
  const BlockHash both[] = {Hash(0), Hash(1)};
  MatchResult m = store_->Match("ns", layout_id_, both, absl::Seconds(5));
  ASSERT_EQ(m.matched_blocks, 2u);
  ASSERT_NE(m.lease_id, 0u);
  EXPECT_EQ(store_->Stats().active_leases, 1u);
  EXPECT_EQ(store_->Stats().pinned_blocks, 2u);
  // The device tier is all pinned: a new block cannot get room there.
  auto session = store_->BeginPut("ns", layout_);
  EXPECT_EQ(session->AddSlice(Hash(2), Slice(0, 1)).code(), absl::StatusCode::kResourceExhausted);
  clock_.Advance(absl::Seconds(6));
  store_->ExpireLeases();
  EXPECT_EQ(store_->Stats().active_leases, 0u);
  EXPECT_EQ(store_->Stats().pinned_blocks, 0u);
  EXPECT_TRUE(session->AddSlice(Hash(2), Slice(0, 4)).ok());
  EXPECT_EQ(store_->ReleaseLease(m.lease_id).code(), absl::StatusCode::kNotFound);
}

// Leases end at their own deadlines, whatever order they were taken in,
// and one released early leaves the others' deadlines as they were.
TEST_P(BlockStoreTest, LeasesExpireInDeadlineOrder) {
  Open(4, 4);
  std::vector<BlockHash> hashes;
  for (int i = 0; i < 4; ++i) Put(hashes.emplace_back(Hash(i)));
  const absl::Duration ttls[] = {absl::Seconds(4), absl::Seconds(1), absl::Seconds(3), absl::Seconds(2)};
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i)
    ids.push_back(store_->Match("ns", layout_id_, std::span(&hashes[i], 1), ttls[i]).lease_id);
  ASSERT_TRUE(store_->ReleaseLease(ids[2]).ok());  // the 3 s one, early
  EXPECT_EQ(store_->Stats().active_leases, 3u);
  clock_.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(store_->Stats().active_leases, 2u) << "the 1 s lease ended";
  EXPECT_EQ(store_->ReleaseLease(ids[1]).code(), absl::StatusCode::kNotFound);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(store_->Stats().active_leases, 1u) << "the 2 s lease ended";
  EXPECT_EQ(store_->ReleaseLease(ids[3]).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Stats().pinned_blocks, 1u);
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(store_->Stats().active_leases, 0u) << "the 4 s lease ended";
  EXPECT_EQ(store_->Stats().pinned_blocks, 0u);
  EXPECT_EQ(store_->ReleaseLease(ids[0]).code(), absl::StatusCode::kNotFound);
}

TEST_P(BlockStoreTest, ReleasedLeaseUnpins) {
  Open(1, 1);
  Put(Hash(0));
  const BlockHash h = Hash(0);
  MatchResult m = store_->Match("ns", layout_id_, std::span(&h, 1), absl::ZeroDuration());
  EXPECT_EQ(m.lease_deadline, clock_.Now() + absl::Seconds(10)) << "default ttl";
  ASSERT_TRUE(store_->ReleaseLease(m.lease_id).ok());
  Put(Hash(1));
  Put(Hash(2));  // pushes block 0 out of both tiers
  EXPECT_EQ(TierOf(h), std::nullopt);
}

TEST_P(BlockStoreTest, ReaderPinsTheBlock) {
  Open(1, 1);
  Put(Hash(0));
  auto reader = store_->Read("ns", layout_id_, Hash(0));
  ASSERT_TRUE(reader.ok());
  const std::string before = (*reader)->CopyToString();
  auto session = store_->BeginPut("ns", layout_);
  EXPECT_EQ(session->AddSlice(Hash(1), Slice(0, 4)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*reader)->CopyToString(), before);
  reader->reset();
  EXPECT_TRUE(session->AddSlice(Hash(1), Slice(0, 4)).ok());
  EXPECT_EQ(TierOf(Hash(0)), TierKind::kHost);
}

// A block being read where it is (here: in the host tier, pinned without
// promotion, as the fast path reads) is not promoted from under its reader
// by another read; once the first reader is done, a read promotes it.
TEST_P(BlockStoreTest, ABlockIsNotMovedFromUnderAnotherReader) {
  Open(1, 4);
  Put(Hash(0));
  Put(Hash(1));  // demotes block 0 to the host tier
  ASSERT_EQ(TierOf(Hash(0)), TierKind::kHost);
  BlockStore::ReadOptions in_place;
  in_place.promote = false;
  auto first = store_->Read("ns", layout_id_, Hash(0), in_place);
  ASSERT_TRUE(first.ok());
  const std::string before = (*first)->CopyToString();
  auto second = store_->Read("ns", layout_id_, Hash(0));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)->tier(), TierKind::kHost);
  EXPECT_EQ(TierOf(Hash(0)), TierKind::kHost) << "not promoted while the first reader holds it";
  Put(Hash(2));  // more traffic through the tiers
  EXPECT_EQ((*first)->CopyToString(), before) << "the first reader's bytes stayed put";
  first->reset();
  second->reset();
  ASSERT_TRUE(store_->Read("ns", layout_id_, Hash(0)).ok());
  EXPECT_EQ(TierOf(Hash(0)), TierKind::kDevice) << "promoted once no one else reads it";
}

// Four threads storing and reading through tiers so small that nearly
// every call moves blocks (copies run without the store's lock): every
// block read back has the layers written, nothing fails its checksum, and
// the books balance at the end. Under ASan this also catches a copy that
// outlives its pages.
// 4 threads storing and reading blocks at random through the open store's
// tiers: every block read is what was written, nothing left pinned or
// pending, capacities kept.
void BlockStoreTest::ConcurrentTraffic() {
  SCOPED_TRACE(rng_.Trace());
  absl::Mutex mu;
  std::map<BlockHash, std::vector<std::string>> written;  // guarded by mu
  std::atomic<int> reads_ok{0};
  const uint64_t base_seed = rng_.seed();
  auto worker = [&](int id) {
    std::mt19937_64 rng(base_seed + id);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int op = 0; op < 300; ++op) {
      if (rng() % 2 == 0) {
        std::vector<uint32_t> tokens(16, static_cast<uint32_t>(id * 100000 + op));
        const BlockHash hash = kvblock::ChainHash("ns", kvblock::kNoParent, layout_id_, tokens);
        std::vector<std::string> slices;
        auto session = store_->BeginPut("ns", layout_);
        for (uint32_t l = 0; l < layout_.num_layers; ++l) {
          std::vector<float> x(layout_.LayerShape().values());
          for (float& v : x) v = normal(rng);
          slices.push_back(*kvblock::EncodeBlock(layout_, l, 1, x));
          if (!session->AddSlice(hash, slices.back()).ok()) break;  // full of pinned blocks: fine
        }
        if (session->Finish().incomplete.empty()) {
          absl::MutexLock lock(&mu);
          written[hash] = std::move(slices);
        }
        continue;
      }
      BlockHash hash;
      std::vector<std::string> slices;
      {
        absl::MutexLock lock(&mu);
        if (written.empty()) continue;
        auto it = written.begin();
        std::advance(it, rng() % written.size());
        hash = it->first;
        slices = it->second;
      }
      auto block = store_->Read("ns", layout_id_, hash);
      if (!block.ok()) {
        EXPECT_EQ(block.status().code(), absl::StatusCode::kNotFound) << block.status();
        continue;
      }
      const std::string record = (*block)->CopyToString();
      auto view = kvblock::ParseBlock(record, &layout_);
      ASSERT_TRUE(view.ok()) << view.status();
      for (uint32_t l = 0; l < layout_.num_layers; ++l) {
        ASSERT_EQ(view->Layer(l), kvblock::ParseBlock(slices[l], &layout_)->Layer(0)) << "layer " << l;
      }
      ++reads_ok;
    }
  };
  std::vector<std::thread> threads;
  for (int id = 0; id < 4; ++id) threads.emplace_back(worker, id);
  for (auto& t : threads) t.join();
  EXPECT_GT(reads_ok.load(), 0);
  const StoreStats stats = store_->Stats();
  EXPECT_EQ(stats.checksum_failures, 0u);
  EXPECT_EQ(stats.pinned_blocks, 0u);
  EXPECT_EQ(stats.pending_blocks, 0u);
  EXPECT_GT(stats.tiers[0].demotions + stats.tiers[1].demotions, 0u);
  ExpectWithinCapacity();
}

TEST_P(BlockStoreTest, ConcurrentTrafficThroughTheTiersKeepsEveryByte) {
  Open(3, 4, /*disk_records=*/6);
  ConcurrentTraffic();
}

// The same with a device tier large enough that a slab one demotes several
// blocks a batch (a sixteenth of 32 pages: 4 records).
TEST_P(BlockStoreTest, ConcurrentTrafficWithBatchedDemotionsKeepsEveryByte) {
  Open(32, 48, /*disk_records=*/64);
  ConcurrentTraffic();
}

// A device slab whose copies in wait at a gate once armed: holds a tier
// move half done (its copy runs without the store's lock) while the test
// does something else.
class GatedSlab final : public SlabMemory {
 public:
  explicit GatedSlab(uint64_t bytes) : slab_(*StagedHostSlab::Create(bytes)) {}
  uint64_t size() const override { return slab_->size(); }
  std::string name() const override { return "gated"; }
  absl::Status CopyIn(uint64_t offset, const void* from, size_t n) override {
    absl::MutexLock lock(&mu_);
    if (armed_) {
      waiting_ = true;
      mu_.Await(absl::Condition(
          +[](bool* open) { return *open; }, &open_));
    }
    return slab_->CopyIn(offset, from, n);
  }
  absl::Status CopyOut(uint64_t offset, void* to, size_t n) const override { return slab_->CopyOut(offset, to, n); }
  std::shared_ptr<uint8_t> AllocateHost(size_t n) const override { return slab_->AllocateHost(n); }

  void Arm() {
    absl::MutexLock lock(&mu_);
    armed_ = true;
  }
  void AwaitCopier() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&waiting_));
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }

 private:
  std::unique_ptr<StagedHostSlab> slab_;
  absl::Mutex mu_;
  bool armed_ = false, waiting_ = false, open_ = false;
};

// A store whose device tier is `slab` (host memory when null), for the
// tests of tier moves through it: blocks stored whole, each of fresh
// random latents, their records kept to compare.
class SlabStore {
 public:
  SlabStore(const kvblock::LatentLayout& layout, std::shared_ptr<SlabMemory> slab, uint64_t device_pages,
            uint64_t host_pages)
      : layout_(layout), layout_id_(kvblock::LayoutId(layout)) {
    StoreOptions o;
    o.page_size = kPage;
    o.device_capacity = device_pages * kPage;
    o.host_capacity = host_pages * kPage;
    o.device_slab = std::move(slab);
    store_ = *BlockStore::Create(o, &clock_);
  }
  BlockStore& store() { return *store_; }
  std::string Trace() { return rng_.Trace(); }  // the seed, for SCOPED_TRACE

  // Stores block number hashes.size() (a whole block's slice is its record).
  void Put() {
    std::vector<uint32_t> tokens(16, static_cast<uint32_t>(hashes.size()));
    hashes.push_back(kvblock::ChainHash("ns", kvblock::kNoParent, layout_id_, tokens));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(size_t{layout_.num_layers} * layout_.LayerShape().values());
    for (float& v : x) v = normal(rng_.engine());
    records.push_back(*kvblock::EncodeBlock(layout_, 0, layout_.num_layers, x));
    auto session = store_->BeginPut("ns", layout_);
    ASSERT_TRUE(session->AddSlice(hashes.back(), records.back()).ok());
    ASSERT_EQ(session->Finish().blocks_stored, 1u);
  }
  absl::StatusOr<std::shared_ptr<const PinnedBlock>> Read(size_t i, bool promote = true) {
    BlockStore::ReadOptions options;
    options.promote = promote;
    return store_->Read("ns", layout_id_, hashes[i], options);
  }
  TierKind TierOf(size_t i) { return (*Read(i, /*promote=*/false))->tier(); }
  // Every block reads back (promoted) as it was stored.
  void ExpectAllIntact() {
    for (size_t i = 0; i < hashes.size(); ++i) {
      auto block = Read(i);
      ASSERT_TRUE(block.ok()) << i << ": " << block.status();
      EXPECT_EQ((*block)->CopyToString(), records[i]) << i;
    }
  }

  std::vector<BlockHash> hashes;
  std::vector<std::string> records;

 private:
  kvblock::LatentLayout layout_;
  uint64_t layout_id_;
  ManualClock clock_;
  std::unique_ptr<BlockStore> store_;
  testing::SeededRng rng_;
};

// A promotion whose copy is under way when another reader pins the block
// where it is (its pages, in the host tier) must not free those pages.
TEST(BlockStoreMoves, APromotionReadMeanwhileLeavesTheBlockWithItsReader) {
  auto gated = std::make_shared<GatedSlab>(2 * kPage);
  SlabStore s(SmallLayout(), gated, 2, 4);
  SCOPED_TRACE(s.Trace());
  for (int i = 0; i < 3; ++i) s.Put();  // block 0 goes down to the host tier
  ASSERT_EQ(s.TierOf(0), TierKind::kHost);
  gated->Arm();
  std::thread promoter([&] { EXPECT_TRUE(s.Read(0).ok()); });
  gated->AwaitCopier();  // the promotion is copying, without the lock
  auto reader = s.Read(0, /*promote=*/false);
  ASSERT_TRUE(reader.ok());
  const std::string before = (*reader)->CopyToString();
  gated->Open();
  promoter.join();
  for (int i = 0; i < 3; ++i) s.Put();  // traffic that would reuse freed host pages
  EXPECT_EQ((*reader)->CopyToString(), before) << "the reader's pages were freed under it";
  EXPECT_EQ(s.store().Stats().checksum_failures, 0u);
}

// A block over several pages moves between a slab tier (a GPU's) and the
// host tier in one batch of copies each way (a GPU waits once a batch), and
// comes back with the bytes it was stored with.
TEST(BlockStoreMoves, ATierMoveOfAManyPageBlockIsOneBatchOfCopies) {
  kvblock::LatentLayout layout = SmallLayout();
  layout.num_layers = 16;  // 9,240-byte records: 3 pages
  const size_t record_bytes = kvblock::HeaderFor(layout, 0, layout.num_layers).RecordBytes();
  ASSERT_GT(record_bytes, 2 * kPage);
  auto slab = std::make_shared<RecordingSlab>(6 * kPage);  // 2 blocks
  SlabStore s(layout, slab, 6, 18);
  SCOPED_TRACE(s.Trace());
  s.Put(), s.Put();
  slab->Clear();
  s.Put();  // block 0 goes down to the host tier
  ASSERT_EQ(s.TierOf(0), TierKind::kHost);
  ASSERT_EQ(slab->out_batches.size(), 1u) << "the demotion (a new block's checksum reads nothing back)";
  EXPECT_EQ(RecordingSlab::Bytes(slab->out_batches[0]), record_bytes);
  // The slice, the header and the trailer, none waited for: their sources
  // may be reused at once, and reads see them.
  EXPECT_EQ(slab->in_batches.size(), 3u);
  EXPECT_EQ(slab->unwaited_in_batches, 3u);

  slab->Clear();
  auto promoted = s.Read(0);  // block 1 goes down, block 0 up
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  EXPECT_EQ((*promoted)->tier(), TierKind::kHost);
  EXPECT_EQ((*promoted)->CopyToString(), s.records[0]);
  ASSERT_EQ(slab->in_batches.size(), 1u) << "the promotion";
  EXPECT_EQ(slab->unwaited_in_batches, 0u) << "its source pages are freed once it lands: it waits";
  EXPECT_EQ(RecordingSlab::Bytes(slab->in_batches[0]), record_bytes);
  ASSERT_EQ(slab->out_batches.size(), 2u) << "the demotion, then the read out of the slab";
  for (const auto& batch : slab->out_batches) EXPECT_EQ(RecordingSlab::Bytes(batch), record_bytes);
  // Both moves copy straight from and to the host tier's pages, pinned.
  for (const auto& batch : {slab->in_batches[0], slab->out_batches[0]}) {
    for (const SlabRun& run : batch) EXPECT_TRUE(slab->IsPinned(run.host, run.n));
  }
  EXPECT_EQ(s.TierOf(0), TierKind::kDevice);
  EXPECT_EQ(s.TierOf(1), TierKind::kHost);
  EXPECT_EQ(s.store().Stats().tiers[0].demotions, 2u);
  EXPECT_EQ(s.store().Stats().tiers[0].promotions, 1u);
  s.ExpectAllIntact();  // each promoted in turn, others going down
  EXPECT_EQ(s.store().Stats().checksum_failures, 0u);
}

// Pinning host pages for a GPU's copies can take long (a driver locks
// every page): it runs outside the store's lock, so a demotion pinning a
// host segment for the first time holds up no other call.
TEST(BlockStoreMoves, PinningAHostSegmentHoldsUpNoOtherCall) {
  auto slab = std::make_shared<GatedPinSlab>(2 * kPage);
  SlabStore s(SmallLayout(), slab, 2, 16);  // one block a page: the third goes down
  SCOPED_TRACE(s.Trace());
  s.Put(), s.Put();
  ASSERT_EQ(slab->pins_started(), 0) << "nothing in the host tier yet";
  std::thread demoting([&] { s.Put(); });
  slab->pinning.WaitForNotification();
  // The demotion waits in PinHost; the store answers meanwhile.
  auto stats = std::async(std::launch::async, [&] { return s.store().Stats(); });
  auto read = std::async(std::launch::async, [&] { return s.Read(1, /*promote=*/false).ok(); });
  const bool answered = stats.wait_for(std::chrono::seconds(10)) == std::future_status::ready &&
                        read.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  slab->open.Notify();
  demoting.join();
  EXPECT_TRUE(answered) << "a call waited for the pin";
  const auto seen = stats.get();
  EXPECT_EQ(seen.tiers[0].blocks + seen.tiers[1].blocks, 2u) << "the third block is not stored yet";
  EXPECT_TRUE(read.get());
  EXPECT_EQ(slab->pins_started(), 1);
  EXPECT_EQ(s.TierOf(0), TierKind::kHost);
  s.ExpectAllIntact();
}

// A full slab tier (a GPU's) demotes a sixteenth of itself at a time, in
// one batch of copies, so the blocks stored next find room without a copy
// each; a tier in host memory demotes only what each block needs. Every
// block reads back as stored.
TEST(BlockStoreMoves, ASlabTierDemotesInBatchesAhead) {
  for (const bool in_slab : {true, false}) {
    SCOPED_TRACE(in_slab ? "device tier in a slab" : "device tier in host memory");
    auto slab = std::make_shared<RecordingSlab>(64 * kPage);
    // A sixteenth of 64 pages: 16 KiB, 7 records of 2,340 B and an eighth.
    SlabStore s(SmallLayout(), in_slab ? slab : nullptr, 64, 256);
    SCOPED_TRACE(s.Trace());
    for (int i = 0; i < 64; ++i) s.Put();
    EXPECT_EQ(s.store().Stats().tiers[0].demotions, 0u);
    slab->Clear();
    for (int i = 0; i < 8; ++i) s.Put();
    if (in_slab) {
      EXPECT_EQ(s.store().Stats().tiers[0].demotions, 8u) << "one batch, ahead";
      ASSERT_EQ(slab->out_batches.size(), 1u);
      EXPECT_EQ(RecordingSlab::Bytes(slab->out_batches[0]), 8 * s.records[0].size());
      s.Put();
      EXPECT_EQ(s.store().Stats().tiers[0].demotions, 16u) << "the next batch";
      EXPECT_EQ(slab->out_batches.size(), 2u);
    } else {
      EXPECT_EQ(s.store().Stats().tiers[0].demotions, 8u) << "one for each block";
      s.Put();
      EXPECT_EQ(s.store().Stats().tiers[0].demotions, 9u);
    }
    s.ExpectAllIntact();
    const StoreStats stats = s.store().Stats();
    EXPECT_EQ(stats.checksum_failures, 0u);
    EXPECT_EQ(stats.tiers[0].blocks + stats.tiers[1].blocks, s.hashes.size()) << "nothing dropped";
    for (const TierCounters& t : stats.tiers) EXPECT_LE(t.used_bytes, t.capacity_bytes);
    if (in_slab) {
      EXPECT_GE(slab->checked_records, stats.tiers[0].demotions) << "each checked where it lay";
    }
  }
}

// A slab whose own CRCs are wrong (a broken GPU kernel) loses nothing: the
// landed copies, moved or read, are checked on the host and decide.
TEST(BlockStoreMoves, ASlabsWrongCrcsAreOverruledByTheHostsCheck) {
  auto slab = std::make_shared<RecordingSlab>(4 * kPage);
  slab->wrong_crcs = true;
  SlabStore s(SmallLayout(), slab, 4, 16);
  SCOPED_TRACE(s.Trace());
  for (int i = 0; i < 12; ++i) s.Put();
  EXPECT_EQ(s.store().Stats().tiers[0].demotions, 8u);
  EXPECT_EQ(slab->checked_records, 8u);
  s.ExpectAllIntact();
  EXPECT_GE(slab->checked_records, 8u + s.hashes.size()) << "reads out of the slab are checked there too";
  EXPECT_EQ(s.store().Stats().checksum_failures, 0u);
}

TEST_P(BlockStoreTest, CorruptedBytesAreNeverServed) {
  Put(Hash(0));
  Corrupt(Hash(0), 200);
  EXPECT_EQ(ReadCode(Hash(0)), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadCode(Hash(0)), absl::StatusCode::kNotFound) << "dropped";
  const StoreStats s = store_->Stats();
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_EQ(s.tiers[0].used_bytes, 0u);
}

TEST_P(BlockStoreTest, CorruptionFoundOnDemotionDropsTheBlock) {
  Open(1, 2);
  Put(Hash(0));
  Corrupt(Hash(0), 300);
  Put(Hash(1));  // demotes block 0, verifying it on the way
  EXPECT_EQ(TierOf(Hash(0)), std::nullopt);
  EXPECT_EQ(store_->Stats().checksum_failures, 1u);
  EXPECT_EQ(store_->Stats().tiers[1].used_bytes, 0u);
}

TEST_P(BlockStoreTest, NamespacesNeverSeeEachOthersBlocks) {
  const BlockHash h = Hash(0);
  Put(h, "tenant-a");
  EXPECT_EQ(store_->Match("tenant-b", layout_id_, std::span(&h, 1)).matched_blocks, 0u);
  EXPECT_EQ(ReadCode(h, "tenant-b"), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadCode(h, "tenant-a"), absl::StatusCode::kOk);
  EXPECT_EQ(store_->Read("tenant-a", layout_id_ ^ 1, h).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(BlockStoreTest, MatchStopsAtTheFirstMissingBlock) {
  Put(Hash(0));
  Put(Hash(1));
  Put(Hash(3));
  const BlockHash chain[] = {Hash(0), Hash(1), Hash(2), Hash(3)};
  EXPECT_EQ(store_->Match("ns", layout_id_, chain).matched_blocks, 2u);
  EXPECT_EQ(store_->Match("ns", layout_id_ + 1, chain).matched_blocks, 0u);
}

TEST_P(BlockStoreTest, RandomWorkloadNeverExceedsCapacity) {
  SCOPED_TRACE(rng_.Trace());
  Open(5, 7);
  std::uniform_int_distribution<int> block(0, 30), op(0, 3);
  std::vector<std::shared_ptr<const PinnedBlock>> held;
  for (int i = 0; i < 400; ++i) {
    const BlockHash h = Hash(block(rng_.engine()));
    switch (op(rng_.engine())) {
      case 0:
      case 1: {
        auto session = store_->BeginPut("ns", layout_);
        for (uint32_t l = 0; l < 4; ++l) {
          absl::Status s = session->AddSlice(h, Slice(l, 1));
          ASSERT_TRUE(s.ok() || s.code() == absl::StatusCode::kResourceExhausted) << s;
        }
        session->Finish();
        break;
      }
      case 2: {
        auto r = store_->Read("ns", layout_id_, h);
        ASSERT_TRUE(r.ok() || r.status().code() == absl::StatusCode::kNotFound) << r.status();
        if (r.ok() && held.size() < 3) held.push_back(*r);
        break;
      }
      case 3:
        if (!held.empty()) held.erase(held.begin());
        clock_.Advance(absl::Seconds(1));
        break;
    }
    ExpectWithinCapacity();
  }
  held.clear();
  const StoreStats s = store_->Stats();
  EXPECT_GT(s.metadata_bytes, 0u);
  EXPECT_EQ(s.pending_blocks, 0u);
  // Use counts the memory blocks take: whole pages.
  const size_t record = kvblock::HeaderFor(layout_, 0, 4).RecordBytes();
  EXPECT_EQ(s.tiers[0].used_bytes + s.tiers[1].used_bytes,
            (s.tiers[0].blocks + s.tiers[1].blocks) * ((record + kPage - 1) / kPage) * kPage);
}

TEST_P(BlockStoreTest, DiskTierTakesWhatHostDemotesAndDropsLast) {
  Open(2, 2, 3);
  for (int i = 0; i < 7; ++i) Put(Hash(i));
  StoreStats s = store_->Stats();
  ASSERT_EQ(s.tiers.size(), 3u);
  EXPECT_EQ(s.tiers[2].tier, TierKind::kDisk);
  EXPECT_EQ(s.tiers[2].blocks, 3u);
  EXPECT_EQ(s.tiers[1].demotions, 3u);
  EXPECT_EQ(s.tiers[2].evictions, 0u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(TierOf(Hash(i)), TierKind::kDisk) << i;
  Put(Hash(7));
  s = store_->Stats();
  EXPECT_EQ(s.tiers[2].evictions, 1u);
  EXPECT_LE(s.tiers[2].used_bytes, s.tiers[2].capacity_bytes);
  // A read from disk promotes to the device tier.
  auto block = store_->Read("ns", layout_id_, Hash(1));
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ((*block)->tier(), TierKind::kDisk);
  block->reset();
  EXPECT_EQ(TierOf(Hash(1)), TierKind::kDevice);
}

// The move to disk checks what it writes: a record altered in host memory
// is dropped, never written to a file.
TEST_P(BlockStoreTest, CorruptionFoundOnDemotionToDiskDropsTheBlock) {
  Open(1, 1, 3);
  Put(Hash(0));
  Put(Hash(1));  // block 0 to the host tier
  ASSERT_EQ(TierOf(Hash(0)), TierKind::kHost);
  Corrupt(Hash(0), 300);
  ASSERT_EQ(TierOf(Hash(0)), TierKind::kHost);
  Put(Hash(2));  // block 1 to the host tier, block 0 on to disk
  EXPECT_EQ(TierOf(Hash(0)), std::nullopt);
  const StoreStats s = store_->Stats();
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_EQ(s.tiers[2].blocks, 0u);
  EXPECT_EQ(TierOf(Hash(1)), TierKind::kHost);
}

TEST_P(BlockStoreTest, RestartFindsTheDiskTiersBlocks) {
  Open(1, 1, 4);
  std::map<int, std::vector<std::string>> slices;
  for (int i = 0; i < 5; ++i) slices[i] = Put(Hash(i));
  for (int i = 0; i < 3; ++i) {  // 0, 1, 2 went to disk; reading would promote, so Match only
    ASSERT_EQ(TierOf(Hash(i)), TierKind::kDisk) << i;
  }
  // Reopen: the memory tiers start empty, the disk tier as it was.
  Open(1, 1, 4);
  StoreStats s = store_->Stats();
  EXPECT_EQ(s.tiers[2].blocks, 3u);
  EXPECT_EQ(s.tiers[0].blocks + s.tiers[1].blocks, 0u);
  for (int i = 0; i < 3; ++i) ExpectStored(Hash(i), slices[i], BlockStore::ReadOptions());
  EXPECT_EQ(ReadCode(Hash(4)), absl::StatusCode::kNotFound) << "was in memory";
}

// A stop moves the memory tiers' blocks to the disk tier, the most
// recently used first, and the next start finds every block in the order
// they had: those from memory newest (the first tier's before the next's),
// those on disk before the stop oldest. Which blocks new ones push out
// shows that order.
TEST_P(BlockStoreTest, SaveForRestartKeepsTheMemoryTiersBlocksInTheirOrder) {
  const auto lru = [](StoreOptions& o) { o.eviction = Eviction::kLru; };
  Open(2, 2, 6, lru);
  std::map<int, std::vector<std::string>> slices;
  for (int i = 0; i < 6; ++i) slices[i] = Put(Hash(i));
  ASSERT_TRUE(Held(Hash(2)));  // newest first, device: 5, 4; host: 2, 3; disk: 1, 0
  const StoreStats before = store_->Stats();
  for (size_t tier = 0; tier < 3; ++tier) ASSERT_EQ(before.tiers[tier].blocks, 2u) << tier;
  const size_t record = kvblock::HeaderFor(layout_, 0, 4).RecordBytes();

  const BlockStore::Saved saved = store_->SaveForRestart(clock_.Now() + absl::Seconds(1));
  EXPECT_EQ(saved.blocks, 4u);
  EXPECT_EQ(saved.bytes, 4 * record);
  EXPECT_EQ(saved.left_blocks, 0u);
  Open(2, 2, 6, lru);
  const StoreStats after = store_->Stats();
  EXPECT_EQ(after.tiers[2].blocks, 6u);
  EXPECT_EQ(after.tiers[0].blocks + after.tiers[1].blocks, 0u);
  // Four new blocks fill the memory tiers; each after them pushes one to
  // disk, and the oldest there goes: 0, 1, then 3 (2 was used after it).
  for (int i = 0; i < 7; ++i) Put(Hash(100 + i));
  for (int i : {0, 1, 3}) EXPECT_FALSE(Held(Hash(i))) << i;
  BlockStore::ReadOptions where_it_is;
  where_it_is.promote = false;
  for (int i : {2, 4, 5}) ExpectStored(Hash(i), slices[i], where_it_is);
}

// A disk tier smaller than the memory tiers: the most recently used that
// fit go down, the disk's own blocks giving way, never one moved before.
TEST_P(BlockStoreTest, SaveForRestartKeepsTheNewestWhereTheDiskIsSmall) {
  const auto lru = [](StoreOptions& o) { o.eviction = Eviction::kLru; };
  Open(2, 2, 3, lru);
  for (int i = 0; i < 6; ++i) Put(Hash(i));  // device: 5, 4; host: 3, 2; disk: 1, 0
  const BlockStore::Saved saved = store_->SaveForRestart(clock_.Now() + absl::Seconds(1));
  EXPECT_EQ(saved.blocks, 3u);
  EXPECT_EQ(saved.left_blocks, 1u);
  Open(2, 2, 3, lru);
  EXPECT_EQ(store_->Stats().tiers[2].blocks, 3u);
  for (int i : {3, 4, 5}) EXPECT_TRUE(Held(Hash(i))) << i;
  for (int i : {0, 1, 2}) EXPECT_FALSE(Held(Hash(i))) << i;
}

// Leases end first (no caller is left to read), a leased block moves like
// any other, one a reader holds stays (and the next still go), and nothing
// moves past the deadline.
TEST_P(BlockStoreTest, SaveForRestartEndsLeasesAndStopsAtItsDeadline) {
  Open(2, 2, 8);
  for (int i = 0; i < 4; ++i) Put(Hash(i));
  const BlockHash leased = Hash(3);
  ASSERT_NE(store_->Match("ns", layout_id_, std::span(&leased, 1), absl::Seconds(60)).lease_id, 0u);
  const BlockStore::Saved late = store_->SaveForRestart(clock_.Now());
  EXPECT_EQ(late.blocks, 0u);
  EXPECT_EQ(late.left_blocks, 4u);
  EXPECT_EQ(store_->Stats().active_leases, 0u);
  EXPECT_EQ(store_->Stats().tiers[2].blocks, 0u);
  BlockStore::ReadOptions where_it_is;
  where_it_is.promote = false;
  auto held = store_->Read("ns", layout_id_, Hash(2), where_it_is);
  ASSERT_TRUE(held.ok()) << held.status();
  const BlockStore::Saved saved = store_->SaveForRestart(clock_.Now() + absl::Seconds(1));
  EXPECT_EQ(saved.blocks, 3u);
  EXPECT_EQ(saved.left_blocks, 1u);
  held->reset();
  const StoreStats s = store_->Stats();
  EXPECT_EQ(s.tiers[2].blocks, 3u);
  EXPECT_EQ(s.pinned_blocks, 0u);
  EXPECT_NE(TierOf(Hash(2)), TierKind::kDisk);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ReadCode(Hash(i)), absl::StatusCode::kOk) << i;
}

TEST_P(BlockStoreTest, SaveForRestartWithoutADiskTierMovesNothing) {
  for (int i = 0; i < 3; ++i) Put(Hash(i));
  const BlockStore::Saved saved = store_->SaveForRestart(clock_.Now() + absl::Seconds(1));
  EXPECT_EQ(saved.blocks + saved.left_blocks, 0u);
  EXPECT_EQ(store_->Stats().tiers[0].blocks, 3u);
}

// The disk file of `hash` in `ns`.
std::filesystem::path DiskFile(const std::filesystem::path& dir, const std::string& ns, const BlockHash& hash) {
  return dir / ("ns-" + ns) / (kvblock::HashToHex(hash) + ".kvb");
}

// A start checks each disk file's key, owner and length, not its bytes
// (which every read and move checks): a file whose key is altered or that
// was cut short is dropped and counted then, one whose record is altered
// at its first read, and neither is ever served.
TEST_P(BlockStoreTest, CorruptDiskFilesAreDroppedAndCounted) {
  Open(1, 1, 6);
  std::vector<std::vector<std::string>> slices;
  for (int i = 0; i < 6; ++i) slices.push_back(Put(Hash(i)));
  for (int i = 0; i < 4; ++i) ASSERT_EQ(TierOf(Hash(i)), TierKind::kDisk) << i;
  store_.reset();
  // A changed byte, whatever it was (writing a fixed value left the file
  // intact, and the test failing, when the byte already had it: 1 run in
  // about 40).
  const auto flip = [](const std::filesystem::path& path, std::streamoff at) {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(at);
    const char was = static_cast<char>(file.get());
    file.seekp(at);
    file.put(static_cast<char>(was ^ 0x5a));
  };
  flip(DiskFile(disk_dir_, "ns", Hash(0)), 500);  // in the record's payload
  flip(DiskFile(disk_dir_, "ns", Hash(1)), 10);   // in the key's hash
  const std::filesystem::path cut = DiskFile(disk_dir_, "ns", Hash(2));
  std::filesystem::resize_file(cut, std::filesystem::file_size(cut) - 1);
  std::ofstream(disk_dir_ / "ns-ns" / "torn.kvb.tmp") << "partial";
  Open(1, 1, 6);
  StoreStats s = store_->Stats();
  EXPECT_EQ(s.tiers[2].blocks, 2u);
  EXPECT_EQ(s.checksum_failures, 2u);
  EXPECT_FALSE(std::filesystem::exists(disk_dir_ / "ns-ns" / "torn.kvb.tmp"));
  EXPECT_FALSE(std::filesystem::exists(DiskFile(disk_dir_, "ns", Hash(1))));
  EXPECT_FALSE(std::filesystem::exists(cut));
  EXPECT_EQ(ReadCode(Hash(1)), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadCode(Hash(2)), absl::StatusCode::kNotFound);
  ExpectStored(Hash(3), slices[3], {});
  EXPECT_EQ(ReadCode(Hash(0)), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->Stats().checksum_failures, 3u);
  EXPECT_EQ(ReadCode(Hash(0)), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(DiskFile(disk_dir_, "ns", Hash(0))));
}

// Two valid files swapped on disk: each names the other's key, so neither
// is ever served as the other's block, running or after a restart.
TEST_P(BlockStoreTest, SwappedDiskFilesAreNeverServedAsEachOther) {
  Open(1, 1, 4);
  for (int i = 0; i < 4; ++i) Put(Hash(i));
  ASSERT_EQ(TierOf(Hash(0)), TierKind::kDisk);
  ASSERT_EQ(TierOf(Hash(1)), TierKind::kDisk);
  const auto swap = [&] {
    const auto a = DiskFile(disk_dir_, "ns", Hash(0)), b = DiskFile(disk_dir_, "ns", Hash(1));
    std::filesystem::rename(a, disk_dir_ / "swap");
    std::filesystem::rename(b, a);
    std::filesystem::rename(disk_dir_ / "swap", b);
  };
  swap();
  EXPECT_EQ(ReadCode(Hash(0)), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadCode(Hash(1)), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->Stats().checksum_failures, 2u);

  // Stored again, swapped while the cache is down: the scan refuses both.
  Put(Hash(0));
  Put(Hash(1));
  for (int i = 4; i < 6; ++i) Put(Hash(i));
  ASSERT_EQ(TierOf(Hash(0)), TierKind::kDisk);
  ASSERT_EQ(TierOf(Hash(1)), TierKind::kDisk);
  store_.reset();
  swap();
  Open(1, 1, 4);
  EXPECT_EQ(store_->Stats().checksum_failures, 2u);
  EXPECT_EQ(ReadCode(Hash(0)), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadCode(Hash(1)), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(DiskFile(disk_dir_, "ns", Hash(0))));
}

// Each disk file names the tenant whose Put stored it: after a restart the
// tenant is charged for its blocks again, and its quota there makes room
// out of its own blocks, not out of another tenant's within its quota.
TEST_P(BlockStoreTest, ARestartChargesEachDiskBlockToItsTenant) {
  Open(1, 1, 8);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(PutAs("bob", {}, 100 + i).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(PutAs("alice", {}, i).ok());
  ASSERT_EQ(store_->SaveForRestart(clock_.Now() + absl::Seconds(1)).blocks, 2u);
  std::map<std::string, std::array<uint64_t, 3>> before = store_->Stats().used_by_owner;
  const uint64_t charged = kvblock::HeaderFor(layout_, 0, 4).RecordBytes() + kBookkeepingBytesPerBlock;
  ASSERT_EQ(before["alice"][2], 4 * charged);
  ASSERT_EQ(before["bob"][2], 4 * charged);
  Open(1, 1, 8);
  StoreStats after = store_->Stats();
  EXPECT_EQ(after.tiers[2].blocks, 8u);
  EXPECT_EQ(after.used_by_owner, before);

  // bob within his quota (his next Put says it); alice over hers.
  constexpr uint64_t kAmple = 64 * kPage;
  store_->BeginPut("ns", layout_, "bob", OwnerQuota{{kAmple, kAmple, 8 * charged}})->Finish();
  for (int i = 20; i < 23; ++i) ASSERT_TRUE(PutAs("alice", OwnerQuota{{kAmple, kAmple, 2 * charged}}, i).ok());
  after = store_->Stats();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(Held(Hash(100 + i))) << "bob's block " << i << " made room for alice's";
  EXPECT_EQ(after.used_by_owner["alice"][2], 2 * charged);
  EXPECT_EQ(after.evictions_by_owner["alice"], 3u);
}

// Quotas given at start (the tenants file's) hold the blocks a restart
// found before their tenants' first Puts: a tenant within its quota keeps
// them while another, without one, makes room out of its own.
TEST_P(BlockStoreTest, QuotasGivenAtStartHoldTheBlocksARestartFound) {
  Open(1, 1, 8);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(PutAs("alice", {}, i).ok());  // the oldest
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(PutAs("bob", {}, 100 + i).ok());
  ASSERT_EQ(store_->SaveForRestart(clock_.Now() + absl::Seconds(1)).blocks, 2u);
  Open(1, 1, 8);
  const uint64_t charged = kvblock::HeaderFor(layout_, 0, 4).RecordBytes() + kBookkeepingBytesPerBlock;
  const std::pair<std::string, OwnerQuota> quotas[] = {{"alice", OwnerQuota{{kPage, kPage, 8 * charged}}},
                                                       {"carol", OwnerQuota{{2 * kPage, 2 * kPage, charged}}}};
  store_->SetQuotas(quotas);
  for (int i = 20; i < 23; ++i) ASSERT_TRUE(PutAs("bob", {}, i).ok());  // the third pushes one to disk
  const StoreStats s = store_->Stats();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(Held(Hash(i))) << "alice's block " << i << " made room for bob's";
  EXPECT_EQ(s.evictions_by_owner.count("alice"), 0u);
  EXPECT_EQ(s.evictions_by_owner.at("bob"), 1u);
  EXPECT_EQ(s.used_by_owner.count("carol"), 0u) << "a quota for a tenant that holds nothing";
}

// Quotas given later (a tenants file read again) replace what the owners'
// Puts said: an owner whose quota was lowered under what it holds, or
// whose tenant is gone from the file, gives room for another's Puts
// before that one's older blocks within its quota.
TEST_P(BlockStoreTest, QuotasGivenLaterReplaceWhatEachOwnersPutsSaid) {
  Open(1, 1, 8);
  const uint64_t charged = kvblock::HeaderFor(layout_, 0, 4).RecordBytes() + kBookkeepingBytesPerBlock;
  const OwnerQuota roomy{{2 * kPage, 2 * kPage, 8 * charged}};
  // Oldest first, each older than the blocks of bob, whose Puts make room
  // from his own blocks too.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(PutAs("alice", roomy, 100 + i).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(PutAs("carol", roomy, 200 + i).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(PutAs("bob", roomy, i).ok());
  ASSERT_TRUE(store_->Stats().evictions_by_owner.empty());

  const std::pair<std::string, OwnerQuota> carol_lowered[] = {
      {"bob", roomy}, {"alice", roomy}, {"carol", OwnerQuota{{2 * kPage, 2 * kPage, charged}}}};
  store_->SetQuotas(carol_lowered);                                      // carol holds more than one on disk
  for (int i = 3; i < 5; ++i) ASSERT_TRUE(PutAs("bob", roomy, i).ok());  // the second evicts one
  StoreStats s = store_->Stats();
  ASSERT_EQ(s.tiers[2].evictions, 1u);
  EXPECT_EQ(s.evictions_by_owner.count("bob"), 0u) << "bob's oldest went, not carol's over her quota";
  EXPECT_EQ(s.evictions_by_owner.count("carol"), 1u);
  EXPECT_EQ(s.quota_by_owner.at("carol")[2], charged);

  const std::pair<std::string, OwnerQuota> alice_gone[] = {{"bob", roomy}, {"carol", roomy}};
  store_->SetQuotas(alice_gone);
  ASSERT_TRUE(PutAs("bob", roomy, 5).ok());
  s = store_->Stats();
  ASSERT_EQ(s.tiers[2].evictions, 2u);
  EXPECT_EQ(s.evictions_by_owner.count("bob"), 0u) << "bob's oldest went, not alice's without a quota";
  EXPECT_EQ(s.evictions_by_owner.count("alice"), 1u);
  EXPECT_EQ(s.quota_by_owner.count("alice"), 0u);
  EXPECT_EQ(s.quota_by_owner.at("carol"), roomy.tier_bytes);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(Held(Hash(i))) << "bob's block " << i;
}

// Files of version 2, written before files named their tenant, are read as
// nobody's blocks; a file whose tenant was altered is refused.
TEST_P(BlockStoreTest, DiskFilesWithoutATenantAreReadAndAlteredTenantsRefused) {
  Open(1, 1, 4);
  const std::vector<std::string> slices = Put(Hash(0));
  Put(Hash(1));
  ASSERT_TRUE(PutAs("alice", {}, 2).ok());
  ASSERT_TRUE(PutAs("alice", {}, 3).ok());
  ASSERT_TRUE(PutAs("alice", {}, 4).ok());
  ASSERT_EQ(TierOf(Hash(0)), TierKind::kDisk);
  ASSERT_EQ(TierOf(Hash(2)), TierKind::kDisk);
  store_.reset();
  const auto read_file = [](const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  // Hash(0)'s file as version 2 wrote it: the same key, no owner.
  const std::string v3 = read_file(DiskFile(disk_dir_, "ns", Hash(0)));
  const std::string v3_header = DiskFileHeader(kDiskFileVersion, "ns", Hash(0), "", 0);
  const std::string record = v3.substr(v3_header.size());
  uint32_t record_crc;
  std::memcpy(&record_crc, record.data() + record.size() - 4, 4);
  ASSERT_EQ(v3.substr(0, v3_header.size()), DiskFileHeader(kDiskFileVersion, "ns", Hash(0), "", record_crc));
  std::ofstream(DiskFile(disk_dir_, "ns", Hash(0)), std::ios::binary | std::ios::trunc)
      << DiskFileHeader(kUnownedDiskFileVersion, "ns", Hash(0), "", record_crc) << record;
  // Hash(2)'s names alice: another name of the same length in its place.
  std::string altered = read_file(DiskFile(disk_dir_, "ns", Hash(2)));
  const size_t at = altered.find("alice");
  ASSERT_NE(at, std::string::npos);
  altered.replace(at, 5, "mallo");
  std::ofstream(DiskFile(disk_dir_, "ns", Hash(2)), std::ios::binary | std::ios::trunc) << altered;

  Open(1, 1, 4);
  StoreStats s = store_->Stats();
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_EQ(s.tiers[2].blocks, 2u);  // Hash(0)'s and Hash(1)'s, nobody's
  EXPECT_EQ(ReadCode(Hash(2)), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.used_by_owner.count("mallo"), 0u);
  EXPECT_EQ(s.used_by_owner[""][2], 2 * (kvblock::HeaderFor(layout_, 0, 4).RecordBytes() + kBookkeepingBytesPerBlock));
  ExpectStored(Hash(0), slices, {});
}

// One DiskDir a directory at a time, in this process as in any other; the
// next opens it once the first is gone.
TEST(DiskDir, OneAtATime) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / absl::StrCat("kvtier_lock_", getpid());
  auto first = DiskDir::Open(dir.string());
  ASSERT_TRUE(first.ok()) << first.status();
  const auto second = DiskDir::Open(dir.string());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find(absl::StrCat("is in use by another kvtier-cache (pid ", getpid(), ")")),
            std::string::npos)
      << second.status();
  first->reset();
  EXPECT_TRUE(DiskDir::Open(dir.string()).ok());
  std::filesystem::remove_all(dir);
}

// A name longer than a disk file can hold is refused, nothing written.
TEST(DiskDir, RefusesAnOwnerLongerThanItsFilesHold) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / absl::StrCat("kvtier_disk_dir_", getpid());
  auto disk = DiskDir::Open(dir.string());
  ASSERT_TRUE(disk.ok()) << disk.status();
  const std::vector<uint8_t> record(64, 7);
  const std::vector<std::span<const uint8_t>> pieces = {record};
  const kvblock::BlockHash hash{};
  EXPECT_EQ((*disk)->Write("ns", hash, std::string(UINT16_MAX + 1, 'a'), pieces).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*disk)->Write("ns", hash, std::string(UINT16_MAX, 'a'), pieces).ok());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir / "ns-ns"), {}), 1);
  std::filesystem::remove_all(dir);
}

// Links planted in the disk directory are never followed: the scan neither
// reads nor deletes what they point to, and a namespace whose directory is
// a link gets no file written through it.
TEST_P(BlockStoreTest, TheDiskTierNeverFollowsLinksOutOfItsDirectory) {
  const std::filesystem::path outside = disk_dir_.string() + "-outside";
  std::filesystem::create_directories(outside);
  std::filesystem::create_directories(disk_dir_ / "ns-ns");
  const BlockHash planted = Hash(100);
  for (const std::string& name : {std::string("garbage.kvb"), kvblock::HashToHex(planted) + ".kvb"}) {
    std::ofstream(outside / name) << "not a record, and not the cache's to delete";
  }
  std::filesystem::create_directory_symlink(outside, disk_dir_ / "ns-evil");
  std::filesystem::create_symlink(outside / (kvblock::HashToHex(planted) + ".kvb"), DiskFile(disk_dir_, "ns", planted));
  Open(1, 1, 8);
  EXPECT_EQ(store_->Stats().checksum_failures, 0u) << "looked through a link";
  EXPECT_EQ(store_->Stats().tiers[2].blocks, 0u);
  EXPECT_EQ(ReadCode(planted), absl::StatusCode::kNotFound);
  for (int i = 0; i < 4; ++i) Put(Hash(i), "evil");  // two of them demoted to disk
  std::set<std::string> left;
  for (const auto& f : std::filesystem::directory_iterator(outside)) left.insert(f.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"garbage.kvb", kvblock::HashToHex(planted) + ".kvb"}));
  EXPECT_GT(store_->Stats().tiers[2].write_errors, 0u);
  std::filesystem::remove_all(outside);
}

// The file system fills before --disk-capacity: the tier evicts its oldest
// blocks to make room and goes on taking new ones, reports what it holds,
// and counts the failed writes.
TEST_P(BlockStoreTest, AFullFileSystemUnderTheDiskTierEvictsToMakeRoom) {
  std::filesystem::create_directories(disk_dir_);
  // 16 pages of tmpfs: about 16 record files, against a capacity of 1,000.
  if (mount("tmpfs", disk_dir_.c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno) << "): needs root";
  }
  const size_t record_bytes = kvblock::HeaderFor(layout_, 0, 4).RecordBytes();
  Open(1, 1, 1000);
  constexpr int kBlocks = 60;
  for (int i = 0; i < kBlocks; ++i) Put(Hash(i));
  const StoreStats s = store_->Stats();
  const TierCounters& disk = s.tiers[2];
  EXPECT_GT(disk.write_errors, 0u);
  EXPECT_GT(disk.evictions, 0u);
  EXPECT_GE(disk.blocks, 8u);
  EXPECT_EQ(disk.used_bytes, disk.blocks * record_bytes) << "reports what it holds";
  size_t files = 0;
  for (const auto& f : std::filesystem::directory_iterator(disk_dir_ / "ns-ns"))
    files += f.path().extension() == ".kvb";
  EXPECT_EQ(files, disk.blocks);
  // Still taking blocks: the last ones demoted are on disk.
  EXPECT_EQ(TierOf(Hash(kBlocks - 3)), TierKind::kDisk);
  EXPECT_EQ(TierOf(Hash(kBlocks - 4)), TierKind::kDisk);
  store_.reset();
  umount(disk_dir_.c_str());
}

// ---- Shared segments: what the fast path hands to same-host readers ----

// A reader's read-only mapping of one segment.
struct ReaderMapping {
  const uint8_t* base = nullptr;
  size_t size = 0;
  ~ReaderMapping() {
    if (base != nullptr) munmap(const_cast<uint8_t*>(base), size);
  }
};

std::unique_ptr<ReaderMapping> MapForReader(int fd) {
  struct stat st;
  EXPECT_EQ(fstat(fd, &st), 0);
  auto m = std::make_unique<ReaderMapping>();
  m->size = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, m->size, PROT_READ, MAP_SHARED, fd, 0);
  EXPECT_NE(p, MAP_FAILED) << std::strerror(errno);
  m->base = p == MAP_FAILED ? nullptr : static_cast<const uint8_t*>(p);
  return m;
}

TEST_P(BlockStoreTest, SharedSegmentsHoldOneNamespaceAndReadBackTheRecord) {
  if (GetParam() != Memory::kSharedSegments) {
    auto block = (Put(Hash(0)), store_->Read("ns", layout_id_, Hash(0)));
    ASSERT_TRUE(block.ok());
    EXPECT_TRUE(store_->SharedPieces(**block).empty()) << "private memory and slabs cannot be shared";
    return;
  }
  SCOPED_TRACE(rng_.Trace());
  Open(8, 8);
  // Interleaved, so a store without ownership would mix them in segments.
  std::map<std::string, std::set<uint32_t>> segments_of;
  for (int i = 0; i < 3; ++i) {
    for (const std::string ns : {"tenant-a", "tenant-b"}) {
      const BlockHash h = Hash(i);
      Put(h, ns);
      auto block = store_->Read(ns, layout_id_, h);
      ASSERT_TRUE(block.ok()) << block.status();
      const std::vector<SharedPiece> pieces = store_->SharedPieces(**block);
      ASSERT_EQ(pieces.size(), 1u);  // one page each
      const std::string record = (*block)->CopyToString();
      EXPECT_EQ(pieces[0].length, record.size());
      segments_of[ns].insert(pieces[0].segment);
      absl::StatusOr<int> fd = store_->OpenSegmentReadOnly(pieces[0].tier, pieces[0].segment, pieces[0].generation, ns);
      ASSERT_TRUE(fd.ok()) << fd.status();
      auto mapping = MapForReader(*fd);
      ASSERT_NE(mapping->base, nullptr);
      ASSERT_LE(pieces[0].offset + pieces[0].length, mapping->size);
      EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(mapping->base) + pieces[0].offset, pieces[0].length),
                record);
      // Read-only for readers: no writable shared mapping of it.
      EXPECT_EQ(mmap(nullptr, mapping->size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0), MAP_FAILED);
      EXPECT_EQ(errno, EACCES);
      const std::string other = ns == "tenant-a" ? "tenant-b" : "tenant-a";
      EXPECT_EQ(
          store_->OpenSegmentReadOnly(pieces[0].tier, pieces[0].segment, pieces[0].generation, other).status().code(),
          absl::StatusCode::kPermissionDenied);
      EXPECT_EQ(
          store_->OpenSegmentReadOnly(pieces[0].tier, pieces[0].segment, pieces[0].generation + 1, ns).status().code(),
          absl::StatusCode::kFailedPrecondition);
      close(*fd);
    }
  }
  for (uint32_t s : segments_of["tenant-a"]) EXPECT_EQ(segments_of["tenant-b"].count(s), 0u) << s;
}

// Shared segments only.
// DeepSeek-V4's records (format 3), of tests/v4_records.h's layout.
class V4StoreTest : public BlockStoreTest {
 protected:
  // A block's record, or the restore point's after `boundary` tokens.
  std::string V4Record(kvblock::RecordKind kind, uint64_t boundary = 16) {
    return testing::RandomV4Record(testing::SmallV4Layout(), kind, boundary, rng_.engine());
  }

  // Puts records under their keys through one session.
  void PutV4(const std::vector<std::pair<BlockHash, std::string>>& records) {
    auto session = store_->BeginPut("ns", testing::SmallV4Layout());
    for (const auto& [hash, record] : records) {
      const absl::Status s = session->AddSlice(hash, record);
      EXPECT_TRUE(s.ok()) << s;
    }
    EXPECT_TRUE(session->Finish().incomplete.empty());
  }

  const uint64_t v4_id_ = kvblock::LayoutId(testing::SmallV4Layout());
};

// A V4 record arrives whole and is stored as it came: its block's and its
// restore point's sizes differ under one layout.
TEST_P(V4StoreTest, RecordsAreStoredWholeAndReadBackAsTheyCame) {
  const BlockHash block = Hash(1), point = kvblock::RestorePointKey(block);
  const std::string block_record = V4Record(kvblock::RecordKind::kBlock);
  const std::string point_record = V4Record(kvblock::RecordKind::kRestorePoint, 32);
  ASSERT_NE(block_record.size(), point_record.size());
  PutV4({{block, block_record}, {point, point_record}});
  for (const auto& [hash, record] : {std::pair(block, block_record), std::pair(point, point_record)}) {
    absl::StatusOr<std::shared_ptr<const PinnedBlock>> read = store_->Read("ns", v4_id_, hash);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ((*read)->CopyToString(), record);
  }
  EXPECT_EQ(store_->Stats().blocks_stored, 2u);
  // The same record again costs nothing; a damaged one is DATA_LOSS.
  PutV4({{block, block_record}});
  EXPECT_EQ(store_->Stats().blocks_deduplicated, 1u);
  std::string damaged = V4Record(kvblock::RecordKind::kBlock);
  damaged[40] ^= 1;
  auto session = store_->BeginPut("ns", testing::SmallV4Layout());
  EXPECT_EQ(session->AddSlice(Hash(2), damaged).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->Read("ns", v4_id_, Hash(2)).status().code(), absl::StatusCode::kNotFound);
}

// Match on V4 ends at the last block of the prefix with a restore point,
// and without the flag it is the plain longest prefix.
TEST_P(V4StoreTest, MatchEndsAtTheLastRestorePoint) {
  Open(16, 16);
  const std::vector<BlockHash> chain = {Hash(0), Hash(1), Hash(2), Hash(3)};
  std::vector<std::pair<BlockHash, std::string>> records;
  for (const BlockHash& h : chain) records.emplace_back(h, V4Record(kvblock::RecordKind::kBlock));
  records.emplace_back(kvblock::RestorePointKey(chain[1]), V4Record(kvblock::RecordKind::kRestorePoint, 32));
  PutV4(records);
  const auto match = [&](bool to_point) {
    return store_->Match("ns", v4_id_, chain, std::nullopt, "", 0, to_point).matched_blocks;
  };
  EXPECT_EQ(match(false), 4u);
  EXPECT_EQ(match(true), 2u);
  // Where the points are in the whole stored prefix, for clients of several shards.
  MatchResult whole = store_->Match("ns", v4_id_, chain, std::nullopt, "", 0, true);
  EXPECT_EQ(whole.stored_blocks, 4u);
  EXPECT_EQ(whole.restore_points, std::vector<uint32_t>{1});
  EXPECT_EQ(whole.tiers.size(), 2u);
  PutV4({{kvblock::RestorePointKey(chain[3]), V4Record(kvblock::RecordKind::kRestorePoint, 64)}});
  EXPECT_EQ(match(true), 4u);
  EXPECT_EQ(store_->Match("ns", v4_id_, chain, std::nullopt, "", 0, true).restore_points,
            (std::vector<uint32_t>{1, 3}));
  // A point of another prefix, or none before the first block, matches nothing.
  const std::vector<BlockHash> other = {Hash(7), Hash(8)};
  PutV4({{Hash(7), V4Record(kvblock::RecordKind::kBlock)}, {Hash(8), V4Record(kvblock::RecordKind::kBlock)}});
  EXPECT_EQ(store_->Match("ns", v4_id_, other, std::nullopt, "", 0, true).matched_blocks, 0u);
  // A lease holds the point with the blocks.
  MatchResult leased = store_->Match("ns", v4_id_, std::span(chain).first(2), absl::Seconds(5), "", 0, true);
  ASSERT_EQ(leased.matched_blocks, 2u);
  EXPECT_TRUE(leased.lease_status.ok());
  EXPECT_TRUE(store_->ReleaseLease(leased.lease_id).ok());
}

// Evicting a V4 block takes its restore point, which could restore
// nothing without it, even when the point was used more recently.
TEST_P(V4StoreTest, EvictingABlockTakesItsRestorePoint) {
  // Two-page records: a layer of ratio 1 over 64 tokens of 64 values, a
  // window of 64.
  kvblock::LatentLayout wide{.model_id = "store-test-v4",
                             .num_layers = 1,
                             .kv_lora_rank = 64,
                             .rope_dim = 0,
                             .tokens_per_block = 64,
                             .codec = kernels::Codec::kFp8,
                             .block_format_version = kvblock::kV4BlockFormatVersion};
  wide.compress_ratios = {1};
  wide.sliding_window = 64;
  const uint64_t wide_id = kvblock::LayoutId(wide);
  const auto record = [&](kvblock::RecordKind kind) { return testing::RandomV4Record(wide, kind, 64, rng_.engine()); };
  Open(4, 4, 0, [](StoreOptions& o) { o.eviction = Eviction::kLru; });
  const BlockHash block = Hash(1), point = kvblock::RestorePointKey(block);
  auto session = store_->BeginPut("ns", wide);
  ASSERT_TRUE(session->AddSlice(block, record(kvblock::RecordKind::kBlock)).ok());
  ASSERT_TRUE(session->AddSlice(point, record(kvblock::RecordKind::kRestorePoint)).ok());
  session->Finish();
  const auto stored = [&](const BlockHash& h) { return store_->Match("ns", wide_id, std::span(&h, 1)).matched_blocks; };
  Put(Hash(10));  // the block goes down to the host tier
  Put(Hash(11));
  Put(Hash(12));  // then the point: the host tier is full, the device's has a page left
  ASSERT_EQ(stored(block), 1u);
  ASSERT_EQ(stored(point), 1u);  // and used after the block
  ASSERT_EQ(store_->Stats().tiers[1].evictions, 0u);
  Put(Hash(13));  // the device tier's last page
  Put(Hash(14));  // block 10 goes down: the host tier evicts the block, and its point with it
  EXPECT_EQ(store_->Stats().tiers[1].evictions, 2u);
  EXPECT_EQ(stored(block), 0u);
  EXPECT_EQ(stored(point), 0u);
  ExpectWithinCapacity();
}

// A V4 block found on disk at a restart still takes its restore point
// when it is evicted: the block, its file older than its point's, goes
// first (LRU by the files' times), and the point with it.
TEST_P(V4StoreTest, ABlockRecoveredFromDiskStillTakesItsPoint) {
  const auto lru = [](StoreOptions& o) { o.eviction = Eviction::kLru; };
  Open(2, 2, 8, lru);  // a V4 block takes two pages
  const BlockHash block = Hash(1), point = kvblock::RestorePointKey(block);
  PutV4({{block, V4Record(kvblock::RecordKind::kBlock)}});
  PutV4({{point, V4Record(kvblock::RecordKind::kRestorePoint, 16)}});
  const auto tier = [&](const BlockHash& h) {
    const MatchResult m = store_->Match("ns", v4_id_, std::span(&h, 1));
    return m.matched_blocks == 1 ? std::optional<TierKind>(m.tiers[0]) : std::nullopt;
  };
  for (int i = 10; tier(point) != TierKind::kDisk && i < 20; ++i) Put(Hash(i));
  ASSERT_EQ(tier(block), TierKind::kDisk);
  ASSERT_EQ(tier(point), TierKind::kDisk);
  // A restart finds them, the block's file the oldest (recovery orders by
  // the files' times).
  store_.reset();
  const auto file = [&](const BlockHash& h) { return disk_dir_ / "ns-ns" / (kvblock::HashToHex(h) + ".kvb"); };
  std::filesystem::last_write_time(file(block), std::filesystem::file_time_type::clock::now() - std::chrono::hours(2));
  std::filesystem::last_write_time(file(point), std::filesystem::file_time_type::clock::now() - std::chrono::hours(1));
  Open(2, 2, 8, lru);
  // Its file, which eviction removes (a Match would refresh it).
  const auto stored = [&](const BlockHash& h) { return std::filesystem::exists(file(h)); };
  ASSERT_TRUE(stored(block));
  ASSERT_TRUE(stored(point));
  // Other V4 blocks, small, push it out: evicting it alone makes room.
  for (int i = 20; stored(block) && i < 200; ++i) PutV4({{Hash(i), V4Record(kvblock::RecordKind::kBlock)}});
  ASSERT_FALSE(stored(block)) << "the disk tier never evicted the block";
  EXPECT_FALSE(stored(point)) << "its restore point outlived it";
  ExpectWithinCapacity();
}

class SharedSegmentsTest : public BlockStoreTest {};

TEST_P(SharedSegmentsTest, ASegmentChangingNamespaceLeavesOldMappingsWithoutTheNewBytes) {
  Open(2, 2);  // one two-page segment per tier
  const BlockHash a0 = Hash(0), a1 = Hash(1);
  Put(a0, "tenant-a");
  Put(a1, "tenant-a");
  std::unique_ptr<ReaderMapping> stale;
  SharedPiece old_piece;
  {
    auto block = store_->Read("tenant-a", layout_id_, a0);
    ASSERT_TRUE(block.ok());
    old_piece = store_->SharedPieces(**block)[0];
    absl::StatusOr<int> fd =
        store_->OpenSegmentReadOnly(old_piece.tier, old_piece.segment, old_piece.generation, "tenant-a");
    ASSERT_TRUE(fd.ok()) << fd.status();
    stale = MapForReader(*fd);
    close(*fd);
  }
  const std::string stale_bytes(reinterpret_cast<const char*>(stale->base), stale->size);
  // tenant-b's blocks push tenant-a's out of the device tier: its segment
  // is tenant-b's now, under a new generation.
  std::vector<std::string> b_records;
  for (int i = 10; i < 12; ++i) {
    Put(Hash(i), "tenant-b");
    auto block = store_->Read("tenant-b", layout_id_, Hash(i));
    ASSERT_TRUE(block.ok());
    const SharedPiece p = store_->SharedPieces(**block)[0];
    EXPECT_EQ(p.tier, old_piece.tier);
    EXPECT_EQ(p.segment, old_piece.segment);
    EXPECT_GT(p.generation, old_piece.generation);
    b_records.push_back((*block)->CopyToString());
  }
  EXPECT_EQ(
      store_->OpenSegmentReadOnly(old_piece.tier, old_piece.segment, old_piece.generation, "tenant-a").status().code(),
      absl::StatusCode::kFailedPrecondition);
  // The stale mapping keeps what it read (tenant-a's), never tenant-b's.
  const std::string_view seen(reinterpret_cast<const char*>(stale->base), stale->size);
  EXPECT_EQ(seen, stale_bytes);
  for (const std::string& r : b_records) EXPECT_EQ(seen.find(r.substr(40, 200)), std::string_view::npos);
  // tenant-a's blocks went down a tier intact.
  EXPECT_EQ(ReadCode(a0, "tenant-a"), absl::StatusCode::kOk);
}

// 132-byte records: 256-byte slots, 16 to a page.
kvblock::LatentLayout TinyLayout() {
  return {.model_id = "store-test-tiny",
          .num_layers = 2,
          .kv_lora_rank = 8,
          .rope_dim = 0,
          .tokens_per_block = 4,
          .codec = kernels::Codec::kInt8};
}

TEST_P(BlockStoreTest, SmallRecordsSharePagesAndReadBackExactly) {
  SCOPED_TRACE(rng_.Trace());
  layout_ = TinyLayout();
  layout_id_ = kvblock::LayoutId(layout_);
  Open(4, 6);  // 64 slots in the device tier
  std::vector<std::string> records;
  for (int i = 0; i < 64; ++i) {
    Put(Hash(i));
    records.push_back((*store_->Read("ns", layout_id_, Hash(i)))->CopyToString());
    ASSERT_EQ(records.back().size(), 132u);
  }
  StoreStats s = store_->Stats();
  EXPECT_EQ(s.tiers[0].blocks, 64u);  // a page each would have demoted 60 of them
  EXPECT_EQ(s.tiers[0].demotions, 0u);
  EXPECT_EQ(s.tiers[0].used_bytes, 64u * 256);
  Put(Hash(64));  // the device tier is full: its least recently used go down
  s = store_->Stats();
  // One; out of a slab, a batch of moves that leaves room ahead.
  EXPECT_GE(s.tiers[0].demotions, 1u);
  if (GetParam() != Memory::kStagedDevice) {
    EXPECT_EQ(s.tiers[0].demotions, 1u);
  }
  EXPECT_EQ(s.tiers[1].blocks, s.tiers[0].demotions);
  EXPECT_EQ(s.tiers[0].blocks + s.tiers[1].blocks, 65u);
  EXPECT_EQ(s.tiers[1].used_bytes, 256u * s.tiers[1].blocks);
  ExpectWithinCapacity();
  for (int i = 0; i < 64; ++i) {
    auto block = store_->Read("ns", layout_id_, Hash(i));
    ASSERT_TRUE(block.ok()) << i << ": " << block.status();
    EXPECT_EQ((*block)->CopyToString(), records[i]) << i;
  }
}

// Small and page-sized records, put, read and evicted at random: every read
// answers exactly the bytes stored, and use never passes capacity.
TEST_P(BlockStoreTest, MixedSizesUnderChurnReadBackExactly) {
  SCOPED_TRACE(rng_.Trace());
  Open(5, 7);
  const kvblock::LatentLayout layouts[] = {SmallLayout(), TinyLayout()};
  std::map<std::pair<int, int>, std::string> stored;  // (layout, i) -> record as last put
  std::uniform_int_distribution<int> which(0, 1), block(0, 40), op(0, 2);
  for (int step = 0; step < 600; ++step) {
    const int l = which(rng_.engine()), i = block(rng_.engine());
    layout_ = layouts[l];
    layout_id_ = kvblock::LayoutId(layout_);
    const BlockHash h = Hash(i);
    if (op(rng_.engine()) < 2) {
      const bool had = TierOf(h).has_value();
      Put(h);  // fresh latents; a block still stored stays as it was (dedup)
      auto read = store_->Read("ns", layout_id_, h);
      ASSERT_TRUE(read.ok()) << read.status();
      if (had) {
        EXPECT_EQ((*read)->CopyToString(), stored.at({l, i})) << l << "/" << i;
      } else {
        stored[{l, i}] = (*read)->CopyToString();
      }
    } else {
      auto read = store_->Read("ns", layout_id_, h);
      ASSERT_TRUE(read.ok() || read.status().code() == absl::StatusCode::kNotFound) << read.status();
      if (read.ok()) {
        EXPECT_EQ((*read)->CopyToString(), stored.at({l, i})) << l << "/" << i;
      }
    }
    ExpectWithinCapacity();
  }
  EXPECT_EQ(store_->Stats().pending_blocks, 0u);
}

// A group's segment that it has not filled holds free pages no other
// group can use: counted as the tier's segment slack, and no more once
// the group fills or empties it.
TEST_P(SharedSegmentsTest, FreePagesOnlyOneGroupCanUseAreCountedAsSlack) {
  Open(4, 4);  // two two-page segments a tier
  const auto device_slack = [&] { return store_->Stats().tiers[0].segment_slack_bytes; };
  EXPECT_EQ(device_slack(), 0u);
  Put(Hash(0), "tenant-a");
  EXPECT_EQ(device_slack(), kPage) << "tenant-a's segment: one page used, one only it can use";
  Put(Hash(1), "tenant-b");
  EXPECT_EQ(device_slack(), 2 * kPage);
  Put(Hash(2), "tenant-a");
  EXPECT_EQ(device_slack(), kPage) << "tenant-a's segment is full";
  EXPECT_EQ(store_->Stats().tiers[1].segment_slack_bytes, 0u) << "nothing demoted yet";
}

// Segments follow the tier's size: a 256th of it, 1 MiB to 4 MiB. In a
// 16 + 16 MiB store (segments of 1 MiB, not 4 MiB) twelve one-block
// groups all keep their blocks; with 4 MiB segments only eight could.
TEST_P(SharedSegmentsTest, SmallGroupsInASmallTierReserveLittle) {
  EXPECT_EQ(StoreOptions{}.SegmentBytes(16 << 20), 1u << 20);
  EXPECT_EQ(StoreOptions{}.SegmentBytes(512 << 20), 2u << 20);
  EXPECT_EQ(StoreOptions{}.SegmentBytes(uint64_t{1} << 30), 4u << 20);
  EXPECT_EQ(StoreOptions{}.SegmentBytes(uint64_t{64} << 30), 4u << 20);
  Open(1, 1, 0, [](StoreOptions& o) {
    o.device_capacity = o.host_capacity = 16 << 20;
    o.segment_bytes = StoreOptions{}.segment_bytes;
  });
  for (int i = 0; i < 12; ++i) Put(Hash(i), "group-" + std::to_string(i));
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(store_->Match("group-" + std::to_string(i), layout_id_, std::vector<BlockHash>{Hash(i)}).matched_blocks,
              1u)
        << "group-" << i << "'s block was pushed out by others' segments";
  }
}

TEST_P(SharedSegmentsTest, SmallRecordsOfTwoNamespacesNeverShareASegment) {
  layout_ = TinyLayout();
  layout_id_ = kvblock::LayoutId(layout_);
  Open(4, 6);
  for (int i = 0; i < 20; ++i) {
    Put(Hash(i), i % 2 == 0 ? "tenant-a" : "tenant-b");
  }
  for (int i = 0; i < 20; ++i) {
    const std::string own = i % 2 == 0 ? "tenant-a" : "tenant-b", other = i % 2 == 0 ? "tenant-b" : "tenant-a";
    auto block = store_->Read(own, layout_id_, Hash(i));
    ASSERT_TRUE(block.ok()) << block.status();
    const std::vector<SharedPiece> pieces = store_->SharedPieces(**block);
    ASSERT_EQ(pieces.size(), 1u);
    EXPECT_EQ(pieces[0].length, 132u);
    EXPECT_EQ(
        store_->OpenSegmentReadOnly(pieces[0].tier, pieces[0].segment, pieces[0].generation, other).status().code(),
        absl::StatusCode::kPermissionDenied);
    absl::StatusOr<int> fd = store_->OpenSegmentReadOnly(pieces[0].tier, pieces[0].segment, pieces[0].generation, own);
    ASSERT_TRUE(fd.ok()) << fd.status();
    // The record is where the piece says.
    std::string seen(pieces[0].length, '\0');
    ASSERT_EQ(pread(*fd, seen.data(), seen.size(), static_cast<off_t>(pieces[0].offset)),
              static_cast<ssize_t>(seen.size()));
    close(*fd);
    EXPECT_EQ(seen, (*block)->CopyToString());
  }
}

// With a segment group per set of namespaces (the cache's: those the same
// tenants may read), the group's namespaces fill segments together, a
// reader of any of them may map them, and other groups never share one.
// Twelve one-record namespaces of one group fit a store that holds few
// segments (each namespace its own would not).
TEST_P(SharedSegmentsTest, NamespacesOfOneGroupShareSegmentsAndOtherGroupsNever) {
  layout_ = TinyLayout();
  layout_id_ = kvblock::LayoutId(layout_);
  Open(4, 4, 0, [](StoreOptions& o) {  // two segments a tier
    o.segment_group = [](const std::string& ns) { return ns.starts_with("acme") ? std::string("acme") : ns; };
  });
  for (int i = 0; i < 12; ++i) Put(Hash(i), "acme-" + std::to_string(i));
  std::set<std::pair<uint32_t, uint32_t>> acme_segments;
  for (int i = 0; i < 12; ++i) {
    auto block = store_->Read("acme-" + std::to_string(i), layout_id_, Hash(i));
    ASSERT_TRUE(block.ok()) << "acme-" << i << ": " << block.status();
    const SharedPiece piece = store_->SharedPieces(**block)[0];
    acme_segments.insert({piece.tier, piece.segment});
    // A reader of another namespace of the group maps it.
    absl::StatusOr<int> fd = store_->OpenSegmentReadOnly(piece.tier, piece.segment, piece.generation, "acme-0");
    ASSERT_TRUE(fd.ok()) << fd.status();
    close(*fd);
  }
  EXPECT_EQ(acme_segments.size(), 1u) << "twelve small records of one group in several segments";
  Put(Hash(100), "globex");
  auto theirs = store_->Read("globex", layout_id_, Hash(100));
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  const SharedPiece piece = store_->SharedPieces(**theirs)[0];
  EXPECT_FALSE(acme_segments.contains({piece.tier, piece.segment})) << "two groups in one segment";
  EXPECT_EQ(store_->OpenSegmentReadOnly(piece.tier, piece.segment, piece.generation, "acme-0").status().code(),
            absl::StatusCode::kPermissionDenied);
}

std::string MemoryName(const ::testing::TestParamInfo<Memory>& info) {
  switch (info.param) {
    case Memory::kPrivate:
      return "Private";
    case Memory::kSharedSegments:
      return "SharedSegments";
    case Memory::kStagedDevice:
      return "StagedDevice";
  }
  return "";
}
INSTANTIATE_TEST_SUITE_P(Memory, BlockStoreTest,
                         ::testing::Values(Memory::kPrivate, Memory::kSharedSegments, Memory::kStagedDevice),
                         MemoryName);
INSTANTIATE_TEST_SUITE_P(Memory, SharedSegmentsTest, ::testing::Values(Memory::kSharedSegments), MemoryName);
INSTANTIATE_TEST_SUITE_P(Memory, V4StoreTest,
                         ::testing::Values(Memory::kPrivate, Memory::kSharedSegments, Memory::kStagedDevice),
                         MemoryName);

TEST(BlockStoreOptions, RefusesCapacitiesBelowOnePage) {
  StoreOptions o;
  o.device_capacity = 0;
  o.host_capacity = 1 << 20;
  EXPECT_EQ(BlockStore::Create(o, SystemClock::Get()).status().code(), absl::StatusCode::kInvalidArgument);
  o.device_capacity = 1 << 20;
  o.host_capacity = 100;
  EXPECT_EQ(BlockStore::Create(o, SystemClock::Get()).status().code(), absl::StatusCode::kInvalidArgument);
  o.host_capacity = 1 << 20;
  o.disk_dir = "/tmp/kvtier-no-capacity";
  EXPECT_EQ(BlockStore::Create(o, SystemClock::Get()).status().code(), absl::StatusCode::kInvalidArgument);
  o.disk_capacity = 1 << 20;
  o.disk_dir = "/proc/kvtier-cannot-create";
  EXPECT_EQ(BlockStore::Create(o, SystemClock::Get()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::cache
