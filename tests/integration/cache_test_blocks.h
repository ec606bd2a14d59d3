// Blocks for tests that talk to a real kvtier-cache: a V2-Lite-shaped
// layout with fewer layers, records made from a seed and stored, and a
// wait on Stats.
#ifndef KVTIER_TESTS_INTEGRATION_CACHE_TEST_BLOCKS_H_
#define KVTIER_TESTS_INTEGRATION_CACHE_TEST_BLOCKS_H_

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "services/cache/client/cache_client.h"
#include "services/cache/store/block_store.h"
#include "services/kvblock/block_format.h"
#include "tests/eventually.h"

namespace kvtier::cache {

inline kvblock::LatentLayout TestLayout() {  // 304,164-byte records
  return {.model_id = "integration",
          .num_layers = 8,
          .kv_lora_rank = 512,
          .rope_dim = 64,
          .tokens_per_block = 64,
          .codec = kernels::Codec::kInt8};
}

// What a TestLayout block takes at kvtier-cache's default --page-size (the
// store's): whole pages.
inline uint64_t TestBlockBytesTaken() {
  const uint64_t page = StoreOptions{}.page_size;
  const uint64_t record = kvblock::HeaderFor(TestLayout(), 0, TestLayout().num_layers).RecordBytes();
  return (record + page - 1) / page * page;
}

// What a tenant is charged for a TestLayout block it holds in a tier: its
// pages and its bookkeeping.
inline uint64_t TestBlockCharged() { return TestBlockBytesTaken() + kBookkeepingBytesPerBlock; }

// Latents from a fast generator: the bytes only need to differ per block.
inline std::vector<float> Latents(size_t n, uint64_t seed) {
  std::vector<float> x(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& v : x) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    v = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / (1 << 22);
  }
  return x;
}

// A block as layer-by-layer slices, plus the whole record as stored.
struct TestBlock {
  BlockSlices slices;
  std::string record;
};

inline TestBlock MakeBlock(const kvblock::LatentLayout& layout, const std::string& ns, uint64_t seed) {
  const size_t layer_values = layout.LayerShape().values();
  const std::vector<float> x = Latents(layer_values * layout.num_layers, seed);
  std::vector<uint32_t> tokens(layout.tokens_per_block);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(seed * 131 + i);
  TestBlock b;
  b.slices.hash = kvblock::ChainHash(ns, kvblock::kNoParent, kvblock::LayoutId(layout), tokens);
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    b.slices.records.push_back(
        *kvblock::EncodeBlock(layout, l, 1, std::span(x).subspan(l * layer_values, layer_values)));
  }
  b.record = *kvblock::EncodeBlock(layout, 0, layout.num_layers, x);
  return b;
}

// Stores blocks made from seeds first..first+count-1 in `ns`; returns them.
inline std::vector<TestBlock> StoreBlocks(CacheClient& client, const kvblock::LatentLayout& layout,
                                          const std::string& ns, uint64_t first, int count) {
  std::vector<TestBlock> blocks;
  std::vector<BlockSlices> slices;
  for (int i = 0; i < count; ++i) {
    blocks.push_back(MakeBlock(layout, ns, first + i));
    slices.push_back(blocks.back().slices);
  }
  auto put = client.Put(ns, layout, slices);
  EXPECT_TRUE(put.ok()) << put.status();
  return blocks;
}

// A raw Put stream's messages: its header, and layer `layer` of `b` as a
// slice of its own.
inline v1::PutRequest HeaderMessage(const std::string& ns, const kvblock::LatentLayout& layout) {
  v1::PutRequest header;
  header.mutable_header()->set_kv_namespace(ns);
  *header.mutable_header()->mutable_layout() = kvblock::LayoutToProto(layout);
  return header;
}
inline v1::PutRequest SliceMessage(const TestBlock& b, uint32_t layer) {
  v1::PutRequest slice;
  slice.mutable_slice()->set_block_hash(std::string(kvblock::HashAsBytes(b.slices.hash)));
  slice.mutable_slice()->set_data(b.slices.records[layer]);
  return slice;
}

inline std::vector<kvblock::BlockHash> Hashes(const std::vector<TestBlock>& blocks) {
  std::vector<kvblock::BlockHash> hashes;
  for (const TestBlock& b : blocks) hashes.push_back(b.slices.hash);
  return hashes;
}

// Asks Stats (the server announces nothing) until `done` holds, up to 10 s.
inline bool StatsEventually(CacheClient& client, const std::function<bool(const v1::StatsResponse&)>& done) {
  return testing::Eventually([&] {
    auto s = client.Stats();
    return s.ok() && done(*s);
  });
}

}  // namespace kvtier::cache

#endif  // KVTIER_TESTS_INTEGRATION_CACHE_TEST_BLOCKS_H_
