// UsableCpus against the kernel itself: a child process pinned to one CPU,
// and one moved into a real cgroup with a CPU quota of half a CPU (where
// this machine lets the test make one), directly and below a cgroup of its
// own without a quota.
#include "services/base/usable_cpus.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "tests/in_child.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

TEST(UsableCpus, QuotasParseRoundedUp) {
  EXPECT_EQ(CpusOfCpuMax("150000 100000\n"), 2u);
  EXPECT_EQ(CpusOfCpuMax("50000 100000"), 1u);
  EXPECT_EQ(CpusOfCpuMax("1600000 100000"), 16u);
  EXPECT_EQ(CpusOfCpuMax("max 100000\n"), std::nullopt);
  for (const char* bad : {"", "100000", "0 100000", "-5 100000", "abc 100000", "100000 0", "1 2 3"}) {
    EXPECT_EQ(CpusOfCpuMax(bad), std::nullopt) << bad;
  }
  EXPECT_EQ(CpusOfCfsQuota("250000\n", "100000\n"), 3u);
  EXPECT_EQ(CpusOfCfsQuota("-1\n", "100000\n"), std::nullopt);
  EXPECT_EQ(CpusOfCfsQuota("x", "100000"), std::nullopt);
}

// UsableCpus() in a child process after `prepare` (which returns false to
// give up: -2); -1 if the child failed.
int UsableCpusOfAChild(const std::function<bool(pid_t)>& prepare) {
  return static_cast<int>(testing::InChild([&]() -> long {
                            return prepare(getpid()) ? static_cast<long>(UsableCpus()) : -2;
                          }).value_or(-1));
}

TEST(UsableCpus, AtMostTheMachineAndOneWhenPinnedToOne) {
  const unsigned all = UsableCpus();
  EXPECT_GE(all, 1u);
  EXPECT_LE(all, std::max(1u, std::thread::hardware_concurrency()));
  const int pinned = UsableCpusOfAChild([](pid_t) {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &allowed)) continue;
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      return sched_setaffinity(0, sizeof one, &one) == 0;
    }
    return false;
  });
  ASSERT_NE(pinned, -1);
  if (pinned == -2) GTEST_SKIP() << "could not pin a process to one CPU";
  EXPECT_EQ(pinned, 1);
}

bool Write(const fs::path& file, const std::string& text) {
  std::ofstream out(file);
  out << text;
  out.close();
  return static_cast<bool>(out);
}

// A cgroup with a quota of half a CPU, and one below it without a quota, in
// the v1 cpu hierarchy or v2's; removed at the end.
class QuotaCgroup {
 public:
  QuotaCgroup() {
    const std::string name = "kvtier-usable-cpus-" + std::to_string(getpid());
    std::error_code error;
    if (fs::exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", error)) {
      dir_ = fs::path("/sys/fs/cgroup/cpu") / name;
      ok_ = fs::create_directory(dir_, error) && Write(dir_ / "cpu.cfs_period_us", "100000") &&
            Write(dir_ / "cpu.cfs_quota_us", "50000");
    } else if (fs::exists("/sys/fs/cgroup/cgroup.controllers", error)) {
      dir_ = fs::path("/sys/fs/cgroup") / name;  // v2: only where the root hands the cpu controller down
      ok_ = fs::create_directory(dir_, error) && fs::exists(dir_ / "cpu.max", error) &&
            Write(dir_ / "cpu.max", "50000 100000");
    }
    ok_ = ok_ && fs::create_directory(dir_ / "below", error);
  }
  ~QuotaCgroup() {
    std::error_code error;
    fs::remove(dir_ / "below", error);
    if (!dir_.empty()) fs::remove(dir_, error);
  }
  bool ok() const { return ok_; }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
  bool ok_ = false;
};

TEST(UsableCpus, ACgroupQuotaCapsItAndTheOnesBelowIt) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one CPU: a quota of half a CPU changes nothing";
  QuotaCgroup cgroup;
  if (!cgroup.ok()) GTEST_SKIP() << "cannot make a cgroup with a CPU quota here (not root, or no cpu controller)";
  for (const fs::path& dir : {cgroup.dir(), cgroup.dir() / "below"}) {
    SCOPED_TRACE(dir.string());
    const int cpus = UsableCpusOfAChild([&](pid_t pid) { return Write(dir / "cgroup.procs", std::to_string(pid)); });
    ASSERT_NE(cpus, -1);
    ASSERT_NE(cpus, -2) << "could not move the child into the cgroup";
    EXPECT_EQ(cpus, 1);
  }
}

}  // namespace
}  // namespace kvtier
