// SegmentSpares: the memfds it makes ahead are sealed (against resizing and
// against any writer but the mapping made with them), zeroed, with their
// pages present, and move to where the arena wants them; the memfds it is
// given back are closed, and a reader's stale mapping keeps the bytes it
// was allowed to read.
#include "services/cache/store/segment_spares.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>
#include <string_view>
#include <vector>

#include "tests/cache/store/memory_checks.h"
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
  struct stat st {};
  ASSERT_EQ(fstat(spare->fd, &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), kBytes);
  const int seals = fcntl(spare->fd, F_GET_SEALS);
  constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
  EXPECT_EQ(seals & kSeals, kSeals);
  EXPECT_EQ(st.st_mode & 0777, 0400u);
  // Only the mapping it was made with writes it.
  EXPECT_EQ(mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, spare->fd, 0), MAP_FAILED);
  EXPECT_EQ(pwrite(spare->fd, "x", 1, 0), -1);
  EXPECT_NE(fallocate(spare->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, kBytes), 0);
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
  int fd = -1;
  uint8_t* writer = MapSealedMemfd(kBytes, nullptr, fd);
  EXPECT_NE(writer, nullptr);
  EXPECT_GE(fd, 0);
  std::uniform_int_distribution<int> byte(1, 255);
  for (size_t i = 0; i < kBytes; ++i) writer[i] = static_cast<uint8_t>(byte(rng));
  munmap(writer, kBytes);
  void* reader = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  EXPECT_NE(reader, MAP_FAILED);
  return {fd, static_cast<const uint8_t*>(reader)};
}

// The write seal keeps a retired memfd's pages from being punched out: its
// reader keeps the very bytes it mapped (its own tenant's), and the memfd
// is closed, so the pages go when the reader unmaps.
TEST(SegmentSpares, RetiredMemfdsAreClosedAndTheirReadersKeepWhatTheyRead) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::vector<ReadMemfd> memfds;
  std::vector<std::string> before;
  const auto seen = [](const ReadMemfd& m) { return std::string(reinterpret_cast<const char*>(m.reader), kBytes); };
  {
    SegmentSpares spares(kBytes, 4);
    for (int i = 0; i < 6; ++i) {  // queued for the thread, or closed at once when it holds 4
      memfds.push_back(Filled(rng.engine()));
      before.push_back(seen(memfds.back()));
      ASSERT_FALSE(AllZero(memfds.back().reader, kBytes));
      spares.Retire(memfds.back().fd);
    }
    spares.WaitIdle();
    // One more, left to the destructor.
    memfds.push_back(Filled(rng.engine()));
    before.push_back(seen(memfds.back()));
    spares.Retire(memfds.back().fd);
  }
  for (size_t i = 0; i < memfds.size(); ++i) EXPECT_EQ(seen(memfds[i]), before[i]) << "memfd " << i;
  for (const ReadMemfd& m : memfds) {
    EXPECT_EQ(fcntl(m.fd, F_GETFD), -1) << "memfd " << m.fd << " left open";
    munmap(const_cast<uint8_t*>(m.reader), kBytes);
  }
}

}  // namespace
}  // namespace kvtier::cache
