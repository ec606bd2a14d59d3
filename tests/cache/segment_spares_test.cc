// SegmentSpares: the memfds it makes ahead are sealed, zeroed, with their
// pages present, and move to where the arena wants them; the memfds it is
// given back are punched out, so a reader's stale mapping reads zeros.
#include "services/cache/segment_spares.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>
#include <string_view>
#include <vector>

#include "tests/cache/memory_checks.h"
#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

constexpr size_t kBytes = 256 * 1024;

TEST(SegmentSpares, ASpareIsSealedZeroedPresentAndMovesWhereAsked) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  SegmentSpares spares(kBytes, 2);
  spares.WaitIdle();
  std::optional<SegmentSpares::Spare> spare = spares.Take();
  ASSERT_TRUE(spare.has_value());
  struct stat st{};
  ASSERT_EQ(fstat(spare->fd, &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), kBytes);
  const int seals = fcntl(spare->fd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_TRUE(AllPagesPresent(spare->at, kBytes)) << "made ahead means its pages are already there";
  EXPECT_TRUE(AllZero(spare->at, kBytes));

  // Moved over reserved addresses: written there, seen through the memfd.
  void* reserved = mmap(nullptr, kBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(reserved, MAP_FAILED);
  auto* to = static_cast<uint8_t*>(reserved);
  ASSERT_TRUE(spares.MoveTo(*spare, to));
  std::vector<uint8_t> bytes(kBytes);
  std::uniform_int_distribution<int> byte(1, 255);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng.engine()));
  std::copy(bytes.begin(), bytes.end(), to);
  void* other = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, spare->fd, 0);
  ASSERT_NE(other, MAP_FAILED);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), static_cast<const uint8_t*>(other)));
  munmap(other, kBytes);
  munmap(reserved, kBytes);
  close(spare->fd);
}

// A memfd with fresh random bytes in it, and a reader's read-only mapping.
struct ReadMemfd {
  int fd;
  const uint8_t* reader;
};
ReadMemfd Filled(std::mt19937_64& rng) {
  const int fd = SealedMemfd(kBytes);
  EXPECT_GE(fd, 0);
  void* writer = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT_NE(writer, MAP_FAILED);
  std::uniform_int_distribution<int> byte(1, 255);
  for (size_t i = 0; i < kBytes; ++i) static_cast<uint8_t*>(writer)[i] = static_cast<uint8_t>(byte(rng));
  munmap(writer, kBytes);
  void* reader = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  EXPECT_NE(reader, MAP_FAILED);
  return {fd, static_cast<const uint8_t*>(reader)};
}

TEST(SegmentSpares, RetiredMemfdsArePunchedOutForTheirReaders) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::vector<ReadMemfd> memfds;
  {
    SegmentSpares spares(kBytes, 4);
    for (int i = 0; i < 6; ++i) {  // queued for the thread, or punched at once when it holds 4
      memfds.push_back(Filled(rng.engine()));
      ASSERT_FALSE(AllZero(memfds.back().reader, kBytes));
      spares.Retire(memfds.back().fd);
    }
    spares.WaitIdle();
    for (const ReadMemfd& m : memfds) EXPECT_TRUE(AllZero(m.reader, kBytes));
    // One more, left to the destructor.
    memfds.push_back(Filled(rng.engine()));
    spares.Retire(memfds.back().fd);
  }
  EXPECT_TRUE(AllZero(memfds.back().reader, kBytes));
  for (const ReadMemfd& m : memfds) {
    EXPECT_EQ(fcntl(m.fd, F_GETFD), -1) << "memfd " << m.fd << " left open";
    munmap(const_cast<uint8_t*>(m.reader), kBytes);
  }
}

}  // namespace
}  // namespace kvtier::cache
