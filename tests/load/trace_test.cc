// Traces and their replay (load/trace): parsing, the mapping of trace
// blocks to kvtier blocks, the ceiling, on hand-made traces whose answers
// are worked out by hand; and the replay through a real kvtier-cache.
#include "load/trace/trace.h"

#include <gtest/gtest.h>

#include <sstream>

#include "load/trace/replay.h"
#include "services/base/child_process.h"
#include "services/kvblock/block_format.h"
#include "services/rpc/client_identity.h"
#include "tests/v4_records.h"

namespace kvtier::load {
namespace {

std::vector<TraceRequest> Parse(const std::string& text) {
  std::istringstream in(text);
  absl::StatusOr<std::vector<TraceRequest>> r = ReadTrace(in);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<TraceRequest>{};
}

// Four requests, 512-token trace blocks as 8 kvtier blocks of 64 each:
//   1: ids 1 2 3, 1300 tokens: 20 whole blocks (8 + 8 + 4); nothing stored: 0 hit
//   2: ids 1 2 4, 1536 tokens: 24 blocks; ids 1 2 shared: 16 blocks = 1024 tokens
//   3: ids 1 2 3, 1400 tokens: 21 blocks; 1 2 and the 4 blocks of 3 stored by
//      request 1: 20 blocks = 1280 tokens
//   4: ids 7, 100 tokens: 1 block; 0 hit
constexpr char kTrace[] =
    "{\"timestamp\": 0, \"input_length\": 1300, \"output_length\": 10, \"hash_ids\": [1, 2, 3]}\n"
    "{\"timestamp\": 5, \"input_length\": 1536, \"output_length\": 10, \"hash_ids\": [1, 2, 4]}\n"
    "\n"
    "{\"timestamp\": 9, \"input_length\": 1400, \"output_length\": 10, \"hash_ids\": [1, 2, 3]}\n"
    "{\"timestamp\": 12, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [7]}\n";

TEST(Trace, ReadsRequestsAndRefusesBadLinesByNumber) {
  const std::vector<TraceRequest> requests = Parse(kTrace);
  ASSERT_EQ(requests.size(), 4u);
  EXPECT_EQ(requests[1].timestamp_ms, 5);
  EXPECT_EQ(requests[1].input_length, 1536u);
  EXPECT_EQ(requests[1].hash_ids, (std::vector<uint64_t>{1, 2, 4}));
  std::istringstream limited(kTrace);
  EXPECT_EQ(ReadTrace(limited, 2)->size(), 2u);
  for (const char* bad :
       {"not json", "{\"timestamp\": 0, \"input_length\": -3, \"output_length\": 1, \"hash_ids\": []}",
        "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 1}",
        "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [\"a\"]}"}) {
    std::istringstream in(std::string(kTrace) + bad + "\n");
    absl::StatusOr<std::vector<TraceRequest>> r = ReadTrace(in);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("line 6"), std::string::npos) << r.status();
  }
}

TEST(Trace, TraceBlocksBecomeChainsOfWholeKvtierBlocks) {
  const std::vector<TraceRequest> requests = Parse(kTrace);
  const BlockMapping mapping{.tokens_per_block = 64, .layout_id = 42};
  const auto first = RequestBlocks(requests[0], mapping), second = RequestBlocks(requests[1], mapping);
  EXPECT_EQ(first.size(), 20u);
  EXPECT_EQ(second.size(), 24u);
  EXPECT_EQ(RequestBlocks(requests[3], mapping).size(), 1u);
  // Shared ids, shared keys; from the first differing id on, none shared.
  for (size_t b = 0; b < 16; ++b) EXPECT_EQ(first[b], second[b]) << b;
  for (size_t b = 16; b < 20; ++b) EXPECT_NE(first[b], second[b]) << b;
  // The same ids under another prefix are other blocks (a chain, not a set).
  const TraceRequest moved{.input_length = 512, .hash_ids = {2}};
  EXPECT_NE(RequestBlocks(moved, mapping)[0], first[8]);
  // Another block size or layout, other keys.
  EXPECT_EQ(RequestBlocks(requests[0], {.tokens_per_block = 128, .layout_id = 42}).size(), 10u);
  EXPECT_NE(RequestBlocks(requests[0], {.tokens_per_block = 64, .layout_id = 43})[0], first[0]);
}

TEST(Trace, CeilingIsWhatAnUnboundedCacheServes) {
  EXPECT_EQ(UnboundedHitTokens(Parse(kTrace), {.tokens_per_block = 64}), (std::vector<uint64_t>{0, 1024, 1280, 0}));
}

// DeepSeek-V4, blocks of 128: a prefix restores only where a point was
// stored (after a request's last block before its last token):
//   1: 10 blocks, none stored: 0; stores the point after block 9
//   2: ids 1 2 shared (8 blocks) but no point after block 7: 0
//   3: the 10 blocks of request 1 and its point: 1280 tokens
//   4: no whole block: 0
TEST(Trace, V4CeilingRestoresOnlyWherePointsWereStored) {
  const std::vector<TraceRequest> requests = Parse(kTrace);
  const BlockMapping mapping{.tokens_per_block = 128};
  EXPECT_EQ(RestoreBlocks(requests[0], mapping, 10), 10u);
  EXPECT_EQ(RestoreBlocks(requests[1], mapping, 12), 11u) << "1535 / 128";
  EXPECT_EQ(UnboundedRestorableTokens(requests, mapping), (std::vector<uint64_t>{0, 0, 1280, 0}));
  // A point every 4 blocks as well: request 1 stores them after 4, 8 and
  // 10, so request 2 restores its 8 shared blocks.
  const BlockMapping every_4{.tokens_per_block = 128, .restore_every = 4};
  EXPECT_EQ(kvblock::NewRestorePoints(0, 10, 4), (std::vector<size_t>{4, 8, 10}));
  EXPECT_EQ(kvblock::NewRestorePoints(8, 10, 4), (std::vector<size_t>{10}));
  EXPECT_EQ(kvblock::NewRestorePoints(3, 8, 4), (std::vector<size_t>{4, 8}));
  EXPECT_EQ(kvblock::NewRestorePoints(8, 8, 4), (std::vector<size_t>{}));
  EXPECT_EQ(kvblock::NewRestorePoints(2, 7, 0), (std::vector<size_t>{7}));
  EXPECT_EQ(UnboundedRestorableTokens(requests, every_4), (std::vector<uint64_t>{0, 1024, 1280, 0}));
}

kvblock::LatentLayout SmallLayout() {
  return {
      .model_id = "trace-test", .num_layers = 2, .kv_lora_rank = 512, .rope_dim = 64, .codec = kernels::Codec::kInt8};
}

ReplayResult ReplayWithBudget(const std::string& budget, bool write_back = false) {
  ChildProcess cache({KVTIER_CACHE_BINARY, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--device-memory", "host",
                      "--device-capacity", budget, "--host-capacity", "16KiB"});
  const int port = cache.WaitForListeningPort();
  EXPECT_GT(port, 0);
  cache::CacheClient client(MakeChannel("127.0.0.1:" + std::to_string(port)), absl::Seconds(30));
  const kvblock::LatentLayout layout = SmallLayout();
  absl::StatusOr<ReplayResult> r = Replay(
      Parse(kTrace), client, layout, {.tokens_per_block = 64, .layout_id = kvblock::LayoutId(layout)}, 0, write_back);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ReplayResult{};
}

// Room for everything: the cache serves exactly the ceiling. Room for one
// block less than a page needs: it serves nothing, and says it evicted.
TEST(Replay, ThroughARealCacheHitsTheCeilingWithRoomAndNothingWithout) {
  const ReplayResult roomy = ReplayWithBudget("64MiB");
  EXPECT_EQ(roomy.requests, 4u);
  EXPECT_EQ(roomy.prompt_tokens, 1300u + 1536 + 1400 + 100);
  EXPECT_EQ(roomy.ceiling_tokens, 1024u + 1280);
  EXPECT_EQ(roomy.hit_tokens, roomy.ceiling_tokens);
  const uint64_t record = kvblock::HeaderFor(SmallLayout(), 0, 2).RecordBytes();
  EXPECT_EQ(roomy.bytes_got, (16 + 20) * record);
  EXPECT_EQ(roomy.bytes_put, (20 + 8 + 1 + 1) * record) << "request 2's 8 new blocks, 3's last, 4's one";

  // 20 blocks of request 1 pushed through room for fewer: it holds the
  // most recent, and request 2 finds its prefix (blocks 0-15) gone.
  const ReplayResult tight = ReplayWithBudget(std::to_string(8 * ((record + 16383) / 16384) * 16384));
  EXPECT_EQ(tight.ceiling_tokens, roomy.ceiling_tokens);
  EXPECT_EQ(tight.hit_tokens, 0u) << "LRU with room for 8 blocks keeps no prefix of these requests";
  uint64_t evicted = 0;
  for (const v1::TierStats& t : tight.stats.tiers()) evicted += t.evictions() + t.demotions();
  EXPECT_GT(evicted, 0u);
}

// Write-back stores the blocks answers fill: request 3's 1,400 + 10 tokens
// fill a 22nd block (the others' answers fill none), which later prompts
// never name: one more block put, no hit more.
TEST(Replay, WriteBackStoresTheBlocksAnswersFill) {
  const ReplayResult plain = ReplayWithBudget("64MiB");
  const ReplayResult written = ReplayWithBudget("64MiB", /*write_back=*/true);
  const uint64_t record = kvblock::HeaderFor(SmallLayout(), 0, 2).RecordBytes();
  EXPECT_EQ(plain.written_back, 0u);
  EXPECT_EQ(written.written_back, 1u);
  EXPECT_EQ(written.bytes_put, plain.bytes_put + record);
  EXPECT_EQ(written.hit_tokens, plain.hit_tokens);
  EXPECT_EQ(written.stats.blocks_stored(), plain.stats.blocks_stored() + 1);
}

// The same trace over a real cache in a small V4 layout: with room it
// serves the ceiling, reading request 1's blocks and point for request 3,
// and puts each request's blocks with the point at its last boundary.
TEST(Replay, V4ThroughARealCacheRestoresFromItsPoints) {
  ChildProcess cache({KVTIER_CACHE_BINARY, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--device-memory", "host",
                      "--device-capacity", "64MiB", "--host-capacity", "16KiB"});
  const int port = cache.WaitForListeningPort();
  ASSERT_GT(port, 0);
  cache::CacheClient client(MakeChannel("127.0.0.1:" + std::to_string(port)), absl::Seconds(30));
  kvblock::LatentLayout layout = testing::SmallV4Layout();
  layout.tokens_per_block = 128;
  absl::StatusOr<ReplayResult> r =
      Replay(Parse(kTrace), client, layout, {.tokens_per_block = 128, .layout_id = kvblock::LayoutId(layout)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ceiling_tokens, 1280u);
  EXPECT_EQ(r->hit_tokens, 1280u);
  const size_t block = kvblock::HeaderFor(layout, 0, layout.num_layers).RecordBytes();
  const size_t point =
      kernels::V4RestorePointBytes(layout.V4Parts(), 1280) + kvblock::kBlockHeaderBytes + kvblock::kBlockTrailerBytes;
  EXPECT_EQ(r->bytes_got, 10 * block + point);
  EXPECT_EQ(r->bytes_put, (10 + 12) * block + 2 * point) << "request 1's and 2's blocks and points";
  EXPECT_EQ(Replay(Parse(kTrace), client, layout, {.tokens_per_block = 128, .layout_id = kvblock::LayoutId(layout)}, 0,
                   /*write_back=*/true)
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace kvtier::load
