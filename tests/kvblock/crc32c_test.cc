#include "services/kvblock/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/kernels/crc32c_math.h"
#include "tests/test_random.h"

namespace kvtier::kvblock {
namespace {

// Check values from RFC 3720 (iSCSI), appendix B.4, and the common "123456789".
TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i), dec[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(dec.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(Crc32c("", 0), 0u);
  for (const auto* v : {&zeros, &ones, &inc, &dec}) {
    EXPECT_EQ(Crc32cExtendPortable(0, v->data(), 32), Crc32c(v->data(), 32));
  }
}

TEST(Crc32c, HardwareAndTableAgreeAndExtendComposes) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::vector<uint8_t> data(40000);  // past the 3 x 1 KiB interleaved chunks
  for (auto& b : data) b = static_cast<uint8_t>(rng.engine()());
  std::uniform_int_distribution<size_t> pos(0, data.size());
  for (int i = 0; i < 200; ++i) {
    size_t a = pos(rng.engine()), b = pos(rng.engine());
    if (a > b) std::swap(a, b);
    const uint32_t whole = Crc32c(data.data() + a, b - a);
    ASSERT_EQ(whole, Crc32cExtendPortable(0, data.data() + a, b - a));
    const size_t mid = a + (b - a) / 3;
    ASSERT_EQ(whole, Crc32cExtend(Crc32c(data.data() + a, mid - a), data.data() + mid, b - mid));
  }
}

// Two pieces' CRCs combine into the whole's, for lengths from 0 to past a
// layer slice's, at random split points.
TEST(Crc32c, CombineGivesTheCrcOfTheConcatenation) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::vector<uint8_t> data(70000);
  for (auto& b : data) b = static_cast<uint8_t>(rng.engine()());
  std::uniform_int_distribution<size_t> pos(0, data.size());
  for (int i = 0; i < 200; ++i) {
    size_t a = pos(rng.engine()), b = pos(rng.engine());
    if (a > b) std::swap(a, b);
    const uint32_t first = Crc32c(data.data(), a), second = Crc32c(data.data() + a, b - a);
    ASSERT_EQ(Crc32cCombine(first, second, b - a), Crc32c(data.data(), b)) << a << " + " << b - a;
  }
  EXPECT_EQ(Crc32cCombine(Crc32c(data.data(), 100), 0, 0), Crc32c(data.data(), 100));
  EXPECT_EQ(Crc32cCombine(0, Crc32c(data.data(), 100), 100), Crc32c(data.data(), 100));
}

// The scheme a GPU checks records with (slab.cu, crc32c_math.h): chunks of
// `chunk` bytes from the record's start, one a thread, `threads` a part,
// the whole chunks in the last slots of the parts; each part's slots
// joined pairwise, level by level, the parts in order, then the bytes
// after the whole chunks: the record's CRC, for sizes around the chunk,
// part and page boundaries and a block's.
TEST(Crc32c, ChunksJoinedAsTheGpuJoinsThemGiveTheRecordsCrc) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  uint32_t table[4][256];
  for (uint32_t k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) table[k][b] = kernels::Crc32cTableEntry(k, b);
  }
  std::vector<uint8_t> data(1026468);
  for (auto& b : data) b = static_cast<uint8_t>(rng.engine()());
  for (const auto& [chunk, threads] : {std::pair<uint64_t, uint64_t>{256, 256}, {16, 4}}) {
    for (const size_t bytes : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{257}, size_t{65535},
                               size_t{65536}, size_t{65537}, size_t{131071}, data.size() - 4, data.size()}) {
      const uint64_t whole = bytes / chunk, parts = std::max<uint64_t>(1, (whole + threads - 1) / threads);
      std::vector<uint32_t> part_raw(parts);
      for (uint64_t p = 0; p < parts; ++p) {
        std::vector<uint32_t> raw(threads, 0);
        for (uint64_t t = 0; t < threads; ++t) {
          const int64_t c = kernels::Crc32cChunkInSlot(p * threads + t, parts * threads, whole);
          for (uint64_t i = 0; c >= 0 && i < chunk; i += 4) {
            uint32_t word;
            std::memcpy(&word, data.data() + c * chunk + i, 4);
            raw[t] = kernels::Crc32cWordStep(table, raw[t], word);
          }
        }
        uint32_t factor = kernels::Crc32cZeroBytesFactor(chunk);
        for (uint64_t stride = 1; stride < threads; stride *= 2) {
          for (uint64_t t = 0; t < threads; t += 2 * stride) {
            raw[t] = kernels::Crc32cMultiply(raw[t], factor) ^ raw[t + stride];
          }
          factor = kernels::Crc32cMultiply(factor, factor);
        }
        part_raw[p] = raw[0];
      }
      uint32_t c = 0;
      for (const uint32_t r : part_raw) c = kernels::Crc32cJoin(c, r, chunk * threads);
      const uint64_t tail_at = whole * chunk;
      uint32_t tail = 0;
      for (uint64_t i = tail_at; i < bytes; ++i) tail = (tail >> 8) ^ table[0][(tail ^ data[i]) & 0xff];
      ASSERT_EQ(kernels::Crc32cFromRaw(kernels::Crc32cJoin(c, tail, bytes - tail_at), bytes),
                Crc32c(data.data(), bytes))
          << chunk << "-byte chunks, " << threads << " a part, " << bytes << " bytes";
    }
  }
}

// Every length up to past the 256-byte steps of the carry-less path (and its
// 64-byte and sub-64-byte tails), at every alignment, from a random running
// CRC: the same as the table.
TEST(Crc32c, EveryLengthAndAlignmentAgreesWithTheTable) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::vector<uint8_t> data(1200 + 64);
  for (auto& b : data) b = static_cast<uint8_t>(rng.engine()());
  for (size_t offset = 0; offset < 64; offset += 7) {
    for (size_t size = 0; size <= 1200; ++size) {
      const auto start = static_cast<uint32_t>(rng.engine()());
      ASSERT_EQ(Crc32cExtend(start, data.data() + offset, size),
                Crc32cExtendPortable(start, data.data() + offset, size))
          << "offset " << offset << " size " << size;
    }
  }
}

}  // namespace
}  // namespace kvtier::kvblock
