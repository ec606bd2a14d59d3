// Tier moves in the store, in-process: storing blocks (27 layer slices
// each, as a prefill node sends them) into a full device tier (each block
// pushes one down to the host tier: a demotion), and reading the demoted
// blocks back as a Get does (each read promotes one and pushes another
// down). Every move and read checks the record's CRC. The device tier in
// host memory the store addresses; in a slab it reaches only by copies
// (staged-host: a GPU's code path, its copies memcpy here); and, built
// with CUDA on a machine with a GPU, in the GPU's memory. Compared with
// memcpy of the same bytes in the same rounds (the GPU: pinned cudaMemcpy,
// one way; a block stored crosses twice, a block read three times).
//   tier_move_bench [--blocks N] [--rounds N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "load/bench_layout.h"
#include "load/median.h"
#include "services/cache/store/block_store.h"
#if KVTIER_HAVE_CUDA
#include "services/cache/store/cuda_slab.h"
#endif
#include "services/base/flags.h"
#include "services/kvblock/block_format.h"

namespace kvtier::cache {
namespace {

using load::Median;

using Clock = std::chrono::steady_clock;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "tier_move_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename F>
double Seconds(F f) {
  const auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Phases {
  double store_demoting, read_promoting;  // seconds
};

class Bench {
 public:
  Bench(uint32_t blocks, uint32_t distinct)
      : layout_(load::V2LiteInt8()), blocks_(blocks), slices_(load::RandomBlockSlices(layout_, distinct)) {
    record_bytes_ = kvblock::HeaderFor(layout_, 0, layout_.num_layers).RecordBytes();
  }
  size_t record_bytes() const { return record_bytes_; }

  // Bytes of a device tier that holds `blocks` blocks.
  uint64_t DeviceBytes() const {
    const uint64_t page = 64 * 1024;
    return blocks_ * ((record_bytes_ + page - 1) / page) * page;
  }

  // A store whose device tier holds `blocks` blocks, in `slab` (null: host
  // memory), the host tier 3 times as many; shared memory, as kvtier-cache
  // runs.
  std::unique_ptr<BlockStore> Open(std::shared_ptr<SlabMemory> slab) const {
    StoreOptions o;
    o.device_capacity = DeviceBytes();
    o.host_capacity = 3 * DeviceBytes();
    o.shared_memory = true;
    o.device_slab = std::move(slab);
    absl::StatusOr<std::unique_ptr<BlockStore>> store = BlockStore::Create(o, SystemClock::Get());
    if (!store.ok()) Fail("cannot open a store: " + std::string(store.status().message()));
    return *std::move(store);
  }

  // Round `round` of `store` (each round's blocks are new): stores
  // 2 x blocks, the second half timed (each pushing one of the first half
  // down), then reads the first half back (each promoted, pushing one of
  // the second half down).
  Phases Run(BlockStore& store, uint32_t round) {
    const uint64_t layout_id = kvblock::LayoutId(layout_);
    std::vector<kvblock::BlockHash> hashes;
    for (uint32_t i = 0; i < 2 * blocks_; ++i) {
      std::vector<uint32_t> tokens(layout_.tokens_per_block, i);
      tokens[0] = round;
      hashes.push_back(kvblock::ChainHash("ns", kvblock::kNoParent, layout_id, tokens));
    }
    auto put = [&](uint32_t begin) {
      for (uint32_t i = begin; i < begin + blocks_; ++i) {
        auto session = store.BeginPut("ns", layout_);
        for (const std::string& slice : slices_[i % slices_.size()]) {
          if (absl::Status s = session->AddSlice(hashes[i], slice); !s.ok()) Fail("a slice refused: " + s.ToString());
        }
        if (session->Finish().blocks_stored != 1) Fail("a block not stored");
      }
    };
    put(0);
    const StoreStats before = store.Stats();
    Phases p;
    p.store_demoting = Seconds([&] { put(blocks_); });
    p.read_promoting = Seconds([&] {
      for (uint32_t i = 0; i < blocks_; ++i) {
        auto block = store.Read("ns", layout_id, hashes[i]);
        if (!block.ok()) Fail("a read failed: " + block.status().ToString());
        if ((*block)->tier() != TierKind::kHost) Fail("a block read was not in the host tier");
      }
    });
    // Every read promoted its block; as many went down (a slab tier
    // demotes in batches, so a phase may end a batch ahead).
    const StoreStats after = store.Stats();
    if (after.tiers[0].promotions - before.tiers[0].promotions != blocks_ ||
        after.tiers[0].demotions - before.tiers[0].demotions + 16 < 2 * blocks_) {
      Fail("the tiers did not move as planned");
    }
    return p;
  }

  // The same bytes copied block by block into other memory.
  double Memcpy() {
    std::vector<uint8_t> from(size_t{blocks_} * record_bytes_, 1), to(from.size(), 2);
    return Seconds([&] {
      for (size_t i = 0; i < blocks_; ++i) {
        std::memcpy(to.data() + i * record_bytes_, from.data() + i * record_bytes_, record_bytes_);
      }
    });
  }

  // The same bytes copied into `slab` and out again in one copy each from
  // its pinned host memory (plain pinned cudaMemcpy for a GPU's): the
  // seconds of one way, the two averaged.
  double SlabCopy(SlabMemory& slab) {
    const size_t bytes = size_t{blocks_} * record_bytes_;
    std::shared_ptr<uint8_t> host = slab.AllocateHost(bytes);
    std::memset(host.get(), 1, bytes);
    return Seconds([&] {
             if (!slab.CopyIn(0, host.get(), bytes).ok() || !slab.CopyOut(0, host.get(), bytes).ok()) {
               Fail("a plain copy through the slab failed");
             }
           }) /
           2;
  }

 private:
  kvblock::LatentLayout layout_;
  uint32_t blocks_;
  size_t record_bytes_ = 0;
  std::vector<std::vector<std::string>> slices_;  // distinct blocks' layer slices
};

int Main(int argc, char** argv) {
  uint64_t blocks = 64, rounds = 7;
  FlagParser flags("tier_move_bench [--blocks N] [--rounds N]",
                   "The store's tier moves (1 MB V2-Lite int8 blocks) against memcpy.");
  flags.AddUint("blocks", &blocks, "blocks the device tier holds; twice as many are stored");
  flags.AddUint("rounds", &rounds, "rounds of every row, interleaved; the medians are printed");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "tier_move_bench")) {
    return *exit;
  }
  if (blocks == 0 || rounds == 0) {
    std::fprintf(stderr, "tier_move_bench: --blocks and --rounds must be positive\n");
    return 2;
  }
  Bench bench(static_cast<uint32_t>(blocks), 16);
  // Each device tier, and what its rows are compared with.
  struct Kind {
    const char* name;
    bool gpu;  // compared with pinned copies in and out of its slab
    std::shared_ptr<SlabMemory> slab;
    std::unique_ptr<BlockStore> store;
    std::vector<Phases> phases;
    std::vector<double> reference_s;
  };
  std::vector<Kind> kinds;
  kinds.push_back({"host memory", false, nullptr, nullptr, {}, {}});
  kinds.push_back({"staged slab", false, *StagedHostSlab::Create(bench.DeviceBytes()), nullptr, {}, {}});
#if KVTIER_HAVE_CUDA
  if (absl::StatusOr<std::unique_ptr<CudaSlab>> gpu = CudaSlab::Create(bench.DeviceBytes()); gpu.ok()) {
    kinds.push_back({"GPU slab", true, std::shared_ptr<SlabMemory>(*std::move(gpu)), nullptr, {}, {}});
  } else {
    std::printf("no GPU slab: %s\n", std::string(gpu.status().message()).c_str());
  }
#endif
  for (Kind& k : kinds) {
    k.store = bench.Open(k.slab);
    bench.Run(*k.store, 0);  // writes every page for the first time (page faults): not counted
  }
  for (uint32_t r = 1; r <= rounds; ++r) {
    for (Kind& k : kinds) {
      k.reference_s.push_back(k.gpu ? bench.SlabCopy(*k.slab) : bench.Memcpy());
      k.phases.push_back(bench.Run(*k.store, r));
    }
  }
  const double gb = static_cast<double>(blocks * bench.record_bytes()) / 1e9;
  std::printf(
      "%llu blocks of %zu B (V2-Lite int8) a row; median of %llu rounds; GB/s of blocks, against memcpy "
      "(GPU: pinned cudaMemcpy, one way) of the same bytes in the same rounds\n\n",
      static_cast<unsigned long long>(blocks), bench.record_bytes(), static_cast<unsigned long long>(rounds));
  std::printf("%-40s %8s %12s %10s\n", "device tier / what", "GB/s", "limit GB/s", "of limit");
  for (const Kind& k : kinds) {
    const double limit = gb / Median(k.reference_s);
    const std::pair<const char*, double Phases::*> rows[] = {{"store, each demoting one", &Phases::store_demoting},
                                                             {"read, each promoting one", &Phases::read_promoting}};
    for (const auto& [what, field] : rows) {
      std::vector<double> seconds;
      for (const Phases& p : k.phases) seconds.push_back(p.*field);
      const double rate = gb / Median(seconds);
      const std::string label = std::string(k.name) + ": " + what;
      std::printf("%-40s %8.2f %12.2f %9.2fx\n", label.c_str(), rate, limit, rate / limit);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::cache

int main(int argc, char** argv) { return kvtier::cache::Main(argc, argv); }
