#include "services/base/heap_reuse.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>

#include "tests/in_child.h"

namespace kvtier {
namespace {

constexpr uint64_t kKept = 8 << 20;
constexpr size_t kBlock = kKept / 4;  // a few of gRPC's read buffers

void TouchFreshBlock() {
  auto* p = static_cast<volatile char*>(std::malloc(kBlock));
  for (size_t i = 0; i < kBlock; i += 4096) p[i] = 1;
  std::free(const_cast<char*>(p));
}

// The page faults writing a block costs right after one like it was freed,
// in a child process (glibc's thresholds are a process's own): with
// `keep`, after KeepFreedHeapForReuse; else under glibc's starting trim
// threshold. -2 where the C library does not take them, -1 if the child
// failed.
long FaultsOfTheSecondBlock(bool keep) {
  return testing::InChild([keep]() -> long {
           const bool set = keep ? KeepFreedHeapForReuse(kKept) : mallopt(M_TRIM_THRESHOLD, 128 * 1024) == 1;
           if (!set) return -2;
           TouchFreshBlock();
           rusage before{}, after{};
           getrusage(RUSAGE_SELF, &before);
           TouchFreshBlock();
           getrusage(RUSAGE_SELF, &after);
           return after.ru_minflt - before.ru_minflt;
         })
      .value_or(-1);
}

TEST(HeapReuse, AFreedBlockIsWrittenAgainWithoutFaults) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator serves malloc here, not glibc's";
#endif
  const long pages = kBlock / 4096;
  const long kept = FaultsOfTheSecondBlock(/*keep=*/true);
  if (kept == -2) GTEST_SKIP() << "this C library does not take glibc's thresholds";
  const long given_back = FaultsOfTheSecondBlock(/*keep=*/false);
  std::printf("faults writing a freed %zu MiB block again: %ld kept, %ld given back (of %ld pages)\n", kBlock >> 20,
              kept, given_back, pages);
  ASSERT_GE(kept, 0);
  ASSERT_GE(given_back, 0);
  EXPECT_LT(kept, pages / 100) << "the freed block's pages were kept";
  EXPECT_GT(given_back, pages / 2) << "control: glibc's starting threshold gives them back";
}

}  // namespace
}  // namespace kvtier
