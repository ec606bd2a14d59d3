// PinnedRanges::Split, which keeps a GPU slab's copies inside one host
// registration each (CUDA refuses the rest): checked against a byte-by-
// byte reference on random ranges and runs.
#include "kvtier/kernels/pinned_ranges.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "tests/test_random.h"

namespace kvtier::kernels {
namespace {

using cuda::SlabRun;

constexpr size_t kSpace = 1 << 16;  // the address space the ranges and runs lie in

// Which range each byte of the space is in (-1: none).
using Owners = std::vector<int>;

// The reference: a run cut wherever the owner of the next byte changes.
std::vector<SlabRun> SplitByteByByte(const std::vector<SlabRun>& runs, const uint8_t* space, const Owners& owner) {
  std::vector<SlabRun> out;
  for (const SlabRun& r : runs) {
    const size_t first = static_cast<const uint8_t*>(r.host) - space;
    for (size_t i = 0; i < r.n; ++i) {
      if (i == 0 || owner[first + i] != owner[first + i - 1]) {
        out.push_back({r.offset + i, 0, const_cast<uint8_t*>(space) + first + i});
      }
      ++out.back().n;
    }
  }
  return out;
}

TEST(PinnedRangesTest, RunsAreCutExactlyAtTheBordersOfPinnedRanges) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::vector<uint8_t> space(kSpace);
  for (int round = 0; round < 50; ++round) {
    // Ranges side by side (as a host tier's segments are) and with gaps.
    PinnedRanges pinned;
    Owners owner(kSpace, -1);
    std::vector<size_t> starts;
    for (size_t at = 0, k = 0; at < kSpace; ++k) {
      const size_t gap = rng.engine()() % 3 == 0 ? rng.engine()() % 500 : 0;
      const size_t n = 1 + rng.engine()() % 3000;
      at += gap;
      if (at + n > kSpace) break;
      pinned.Add(space.data() + at, n);
      starts.push_back(at);
      for (size_t i = at; i < at + n; ++i) owner[i] = static_cast<int>(k);
      at += n;
    }
    // One range unpinned again: its bytes are plain memory once more.
    const size_t removed = rng.engine()() % starts.size();
    pinned.Remove(space.data() + starts[removed]);
    for (int& o : owner) o = o == static_cast<int>(removed) ? -1 : o;

    std::vector<SlabRun> runs;
    for (int k = 0; k < 20; ++k) {
      const size_t n = rng.engine()() % 9000, first = rng.engine()() % (kSpace - n);
      runs.push_back({rng.engine()() % (uint64_t{1} << 40), n, space.data() + first});
    }
    std::vector<SlabRun> got;
    pinned.Split(runs, got);
    const std::vector<SlabRun> want = SplitByteByByte(runs, space.data(), owner);
    ASSERT_EQ(got.size(), want.size()) << "round " << round;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].offset, want[i].offset) << i;
      EXPECT_EQ(got[i].n, want[i].n) << i;
      EXPECT_EQ(got[i].host, want[i].host) << i;
    }
  }
}

// Nothing pinned: runs go through as they are.
TEST(PinnedRangesTest, WithNothingPinnedRunsAreKept) {
  std::vector<uint8_t> space(100);
  const std::vector<SlabRun> runs = {{7, 60, space.data()}, {500, 40, space.data() + 60}};
  std::vector<SlabRun> got;
  PinnedRanges().Split(runs, got);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].offset, 500u);
  EXPECT_EQ(got[1].n, 40u);
  EXPECT_EQ(got[1].host, space.data() + 60);
}

}  // namespace
}  // namespace kvtier::kernels
