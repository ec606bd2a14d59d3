// The store under mixed load: reads of blocks in the device tier, alone and
// while another thread stores blocks that each push one down to the host
// tier (a tier move: a 1 MB copy and CRC check). Side by side in one run,
// reads per second and read latency percentiles; moves that held the
// store's lock showed here as a long read tail. Then what a Match of a
// long prefix holds the lock for under each eviction policy: it refreshes
// every block of the prefix (adaptive also moves each in its tier's
// frequency order).
//   store_mix_bench [--seconds N]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "load/bench_layout.h"
#include "services/base/flags.h"
#include "services/cache/store/block_store.h"
#include "services/kvblock/block_format.h"

namespace kvtier::cache {
namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  double reads_per_second, p50_us, p99_us, p999_us;
  uint64_t demotions;
};

// Microseconds a Match of `blocks` stored blocks takes under `eviction`
// (p50 and p99 of `rounds`), in a store of one-layer blocks that holds them.
std::pair<double, double> MatchMicros(Eviction eviction, uint32_t blocks, int rounds) {
  kvblock::LatentLayout layout = load::V2LiteInt8();
  layout.num_layers = 1;
  const uint64_t layout_id = kvblock::LayoutId(layout);
  const std::string record =
      *kvblock::EncodeBlock(layout, 0, 1, std::vector<float>(layout.LayerShape().values(), 0.5f));
  StoreOptions o;
  o.device_capacity = uint64_t{blocks} * (record.size() + (16 << 10));
  o.host_capacity = 16 << 20;
  o.eviction = eviction;
  std::unique_ptr<BlockStore> store = *BlockStore::Create(o, SystemClock::Get());
  std::vector<kvblock::BlockHash> prefix;
  auto session = store->BeginPut("ns", layout);
  for (uint32_t i = 0; i < blocks; ++i) {
    const std::vector<uint32_t> tokens(layout.tokens_per_block, i);
    prefix.push_back(kvblock::ChainHash("ns", i == 0 ? kvblock::kNoParent : prefix.back(), layout_id, tokens));
    (void)session->AddSlice(prefix.back(), record);
  }
  session->Finish();
  std::vector<double> us;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = Clock::now();
    const MatchResult m = store->Match("ns", layout_id, prefix);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (m.matched_blocks != blocks) std::fprintf(stderr, "matched %u of %u blocks\n", m.matched_blocks, blocks);
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100]};
}

int Main(int argc, char** argv) {
  uint64_t seconds = 3;
  FlagParser flags("store_mix_bench [--seconds N]", "Store read latency alone and during tier moves.");
  flags.AddUint("seconds", &seconds, "length of each phase");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "store_mix_bench")) {
    return *exit;
  }
  const kvblock::LatentLayout layout = load::V2LiteInt8();
  const uint64_t layout_id = kvblock::LayoutId(layout);
  StoreOptions o;
  o.device_capacity = 64ull << 20;
  o.host_capacity = 256ull << 20;
  o.shared_memory = true;
  std::unique_ptr<BlockStore> store = *BlockStore::Create(o, SystemClock::Get());
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t{layout.num_layers} * layout.LayerShape().values());
  for (float& v : x) v = normal(rng);
  const std::string record = *kvblock::EncodeBlock(layout, 0, layout.num_layers, x);
  auto put = [&](uint32_t i) {
    std::vector<uint32_t> tokens(layout.tokens_per_block, i);
    const kvblock::BlockHash hash = kvblock::ChainHash("ns", kvblock::kNoParent, layout_id, tokens);
    auto session = store->BeginPut("ns", layout);
    (void)session->AddSlice(hash, record);
    session->Finish();
    return hash;
  };
  std::vector<kvblock::BlockHash> hot;
  for (uint32_t i = 0; i < 8; ++i) hot.push_back(put(i));

  auto phase = [&](bool with_writer) {
    std::atomic<bool> stop{false};
    const uint64_t demotions_before = store->Stats().tiers[0].demotions;
    std::thread writer([&] {
      for (uint32_t i = 1000; with_writer && !stop; ++i) {
        put(i);
        // The hot blocks were just read: they stay the most recently used.
      }
    });
    std::vector<double> us;
    BlockStore::ReadOptions read;
    read.verify_checksum = false;  // time the store, not the CRC
    const auto start = Clock::now(), end = start + std::chrono::seconds(seconds);
    while (Clock::now() < end) {
      for (const kvblock::BlockHash& h : hot) {
        const auto t0 = Clock::now();
        (void)store->Read("ns", layout_id, h, read);
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    stop = true;
    writer.join();
    std::sort(us.begin(), us.end());
    return Row{us.size() / elapsed, us[us.size() / 2], us[us.size() * 99 / 100], us[us.size() * 999 / 1000],
               store->Stats().tiers[0].demotions - demotions_before};
  };
  const Row alone = phase(false), mixed = phase(true);
  std::printf("reads of 8 device-tier blocks, %llu s each\n%-28s %12s %10s %10s %10s %11s\n",
              static_cast<unsigned long long>(seconds), "", "reads/s", "p50 us", "p99 us", "p99.9 us", "demotions");
  for (const auto& [name, r] : {std::pair{"alone", alone}, {"while blocks are demoted", mixed}}) {
    std::printf("%-28s %12.0f %10.2f %10.2f %10.2f %11llu\n", name, r.reads_per_second, r.p50_us, r.p99_us, r.p999_us,
                static_cast<unsigned long long>(r.demotions));
  }
  constexpr uint32_t kPrefixBlocks = 1024;  // 64k tokens of 64-token blocks
  std::printf("\nMatch of a %u-block prefix\n%-28s %10s %10s %14s\n", kPrefixBlocks, "", "p50 us", "p99 us",
              "p50 ns/block");
  for (const auto& [name, eviction] :
       {std::pair{"lru", Eviction::kLru}, {"leaf-first", Eviction::kLeafFirst}, {"adaptive", Eviction::kAdaptive}}) {
    const auto [p50, p99] = MatchMicros(eviction, kPrefixBlocks, 2000);
    std::printf("%-28s %10.1f %10.1f %14.1f\n", name, p50, p99, p50 * 1000 / kPrefixBlocks);
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::cache

int main(int argc, char** argv) { return kvtier::cache::Main(argc, argv); }
