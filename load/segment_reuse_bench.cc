// Storing into a full cache whose segments same-host readers had mapped
// (the fast path). Such a segment gets a new memfd when its next owner
// takes it (a stale mapping must not see the new owner's bytes), and a new
// memfd's pages are allocated and mapped as they are first written, unless
// the arena made it ahead on its own thread (SegmentSpares). In-process,
// one thread storing (as one Put stream does), each prefix under a new
// namespace so that segments change owner. Side by side in each round:
// segments no reader had (cleared in place, the floor), segments readers
// had with memfds made ahead (the default), and with memfds faulted in as
// written; against memcpy of the same bytes.
//   segment_reuse_bench [--rounds N]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "load/bench_layout.h"
#include "load/median.h"
#include "services/base/flags.h"
#include "services/cache/store/block_store.h"

namespace kvtier::cache {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kPrefixBlocks = 16;                // ~16 MB a prefix
constexpr uint64_t kDeviceBytes = uint64_t{1} << 30;  // as cache_bench runs the cache
constexpr uint64_t kHostBytes = uint64_t{64} << 20;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "segment_reuse_bench: %s\n", what.c_str());
  std::exit(1);
}

enum class Readers { kNone, kMadeAhead, kFaultedIn };

class Bench {
 public:
  Bench() : layout_(load::V2LiteInt8()), slices_(load::RandomBlockSlices(layout_, kPrefixBlocks)) {
    record_bytes_ = kvblock::HeaderFor(layout_, 0, layout_.num_layers).RecordBytes();
  }
  double PrefixBytes() const { return double{kPrefixBlocks} * record_bytes_; }

  // GB/s of storing `prefixes` prefixes into a store that the same number
  // has filled, each prefix's segments handed to a reader (as the fast
  // path does) unless `readers` is kNone.
  double Run(Readers readers, uint32_t prefixes) {
    StoreOptions o;
    o.device_capacity = kDeviceBytes;
    o.host_capacity = kHostBytes;
    o.shared_memory = true;
    o.make_segments_ahead = readers != Readers::kFaultedIn;
    absl::StatusOr<std::unique_ptr<BlockStore>> store = BlockStore::Create(o, SystemClock::Get());
    if (!store.ok()) Fail("cannot open a store: " + std::string(store.status().message()));
    uint32_t next = 0;
    for (uint32_t i = 0; i < prefixes; ++i) Store(**store, next++, readers);  // fills it
    const auto start = Clock::now();
    for (uint32_t i = 0; i < prefixes; ++i) Store(**store, next++, readers);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return prefixes * PrefixBytes() / seconds / 1e9;
  }

  // The same slices copied one after another into a prefix-sized buffer.
  double Memcpy(uint32_t prefixes) {
    size_t bytes = 0;
    for (const auto& block : slices_) {
      for (const std::string& s : block) bytes += s.size();
    }
    std::vector<uint8_t> to(bytes, 1);
    const auto start = Clock::now();
    for (uint32_t i = 0; i < prefixes; ++i) {
      size_t at = 0;
      for (const auto& block : slices_) {
        for (const std::string& s : block) {
          std::memcpy(to.data() + at, s.data(), s.size());
          at += s.size();
        }
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (to[to.size() / 2] == 0 && to[1] == 0) std::printf(" ");  // keeps the copies
    return prefixes * PrefixBytes() / seconds / 1e9;
  }

 private:
  // Prefix `n` under namespace "ns<n>"; then, with readers, every segment
  // holding it opened read-only, as a fast path session opens them.
  void Store(BlockStore& store, uint32_t n, Readers readers) {
    const std::string ns = absl::StrCat("ns", n);
    const uint64_t layout_id = kvblock::LayoutId(layout_);
    std::vector<kvblock::BlockHash> hashes;
    for (uint32_t b = 0; b < kPrefixBlocks; ++b) {
      std::vector<uint32_t> tokens(layout_.tokens_per_block, b);
      hashes.push_back(kvblock::ChainHash(ns, kvblock::kNoParent, layout_id, tokens));
      auto session = store.BeginPut(ns, layout_);
      for (const std::string& slice : slices_[b]) {
        if (absl::Status s = session->AddSlice(hashes.back(), slice); !s.ok()) Fail("a slice refused: " + s.ToString());
      }
      if (session->Finish().blocks_stored != 1) Fail("a block not stored");
    }
    if (readers == Readers::kNone) return;
    for (const kvblock::BlockHash& h : hashes) {
      auto block = store.Read(ns, layout_id, h);
      if (!block.ok()) Fail("a read failed: " + block.status().ToString());
      for (const SharedPiece& piece : store.SharedPieces(**block)) {
        absl::StatusOr<int> fd = store.OpenSegmentReadOnly(piece.tier, piece.segment, piece.generation, ns);
        if (!fd.ok()) Fail("cannot open a segment: " + fd.status().ToString());
        close(*fd);
      }
    }
  }

  kvblock::LatentLayout layout_;
  std::vector<std::vector<std::string>> slices_;
  size_t record_bytes_ = 0;
};

int Main(int argc, char** argv) {
  uint64_t rounds = 3;
  FlagParser flags("segment_reuse_bench [--rounds N]",
                   "Stores into a full cache whose segments readers had: memfds made ahead vs faulted in.");
  flags.AddUint("rounds", &rounds, "measurements per row (the median is shown)");
  if (std::optional<int> exit =
          flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "segment_reuse_bench")) {
    return *exit;
  }
  Bench bench;
  const uint32_t prefixes = static_cast<uint32_t>(kDeviceBytes / bench.PrefixBytes());
  std::vector<double> none, ahead, faulted, copy;
  for (uint64_t r = 0; r < std::max<uint64_t>(rounds, 1); ++r) {
    none.push_back(bench.Run(Readers::kNone, prefixes));
    ahead.push_back(bench.Run(Readers::kMadeAhead, prefixes));
    faulted.push_back(bench.Run(Readers::kFaultedIn, prefixes));
    copy.push_back(bench.Memcpy(prefixes));
  }
  std::printf(
      "%u prefixes of %u DeepSeek-V2-Lite int8 blocks (%.1f MB) stored into a full %.0f MiB device tier, "
      "one thread; median of %zu rounds\n\n",
      prefixes, kPrefixBlocks, bench.PrefixBytes() / 1e6, kDeviceBytes / 1048576.0, none.size());
  std::printf("%-52s %8s %10s\n", "store", "GB/s", "of memcpy");
  const double c = load::Median(copy);
  auto row = [&](const char* what, const std::vector<double>& v) {
    std::printf("%-52s %8.2f %9.0f%%\n", what, load::Median(v), 100 * load::Median(v) / c);
  };
  row("segments no reader had (cleared in place)", none);
  row("segments readers had, memfds made ahead", ahead);
  row("segments readers had, memfds faulted in as written", faulted);
  row("memcpy of the same slices", copy);
  std::printf("\nmade ahead / faulted in: %.2fx\n", load::Median(ahead) / load::Median(faulted));
  return 0;
}

}  // namespace
}  // namespace kvtier::cache

int main(int argc, char** argv) { return kvtier::cache::Main(argc, argv); }
