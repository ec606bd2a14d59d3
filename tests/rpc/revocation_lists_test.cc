// RevocationLists' own directory: made private, removed when it goes, and
// one left by a killed process removed by the next process to make one.
#include "services/rpc/revocation_lists.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/temp_dir.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

// $TMPDIR set to `dir` while it lives.
class TmpDirSetTo {
 public:
  explicit TmpDirSetTo(const fs::path& dir) {
    const char* old = std::getenv("TMPDIR");
    if (old != nullptr) old_ = old;
    setenv("TMPDIR", dir.c_str(), 1);
  }
  ~TmpDirSetTo() {
    if (old_.empty()) {
      unsetenv("TMPDIR");
    } else {
      setenv("TMPDIR", old_.c_str(), 1);
    }
  }

 private:
  std::string old_;
};

// A directory named as RevocationLists names theirs, holding a list,
// last modified `age_seconds` ago.
fs::path MakeDir(const fs::path& tmp, const std::string& name, int age_seconds) {
  const fs::path dir = tmp / ("kvtier-crl-" + name);
  fs::create_directories(dir);
  std::ofstream(dir / "0a1b2c3d.r0") << "a list\n";
  const timespec when = {std::time(nullptr) - age_seconds, 0};
  const timespec times[2] = {when, when};
  EXPECT_EQ(utimensat(AT_FDCWD, dir.c_str(), times, 0), 0);
  return dir;
}

TEST(RevocationListsTest, ItsDirectoryIsPrivateAndGoesWithIt) {
  testing::TempDir tmp("kvtier-crl-own-");
  TmpDirSetTo set(tmp.path());
  auto lists = RevocationLists::Make();
  ASSERT_TRUE(lists.ok()) << lists.status();
  const std::string dir = (*lists)->dir();
  EXPECT_EQ(fs::path(dir).parent_path(), tmp.path());
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  lists->reset();
  EXPECT_FALSE(fs::exists(dir));
}

// A live process holds a lock on its directory; one killed holds none. The
// next RevocationLists removes only the directories nobody holds, and
// leaves any made in the last minute (made, not locked yet).
TEST(RevocationListsTest, ADirectoryNoProcessHoldsIsRemovedByTheNext) {
  testing::TempDir tmp("kvtier-crl-sweep-");
  TmpDirSetTo set(tmp.path());
  const fs::path abandoned = MakeDir(tmp.path(), "abandoned", 600);
  const fs::path held = MakeDir(tmp.path(), "held", 600);
  const fs::path young = MakeDir(tmp.path(), "young", 0);
  const fs::path other = tmp.path() / "not-ours";
  fs::create_directories(other);
  const int lock = open(held.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(flock(lock, LOCK_EX), 0);
  auto lists = RevocationLists::Make();
  ASSERT_TRUE(lists.ok()) << lists.status();
  EXPECT_FALSE(fs::exists(abandoned));
  EXPECT_TRUE(fs::exists(held / "0a1b2c3d.r0"));
  EXPECT_TRUE(fs::exists(young));
  EXPECT_TRUE(fs::exists(other));
  close(lock);
  // Its own directory, locked, is left by the next one.
  const timespec old = {std::time(nullptr) - 600, 0};
  const timespec times[2] = {old, old};
  ASSERT_EQ(utimensat(AT_FDCWD, (*lists)->dir().c_str(), times, 0), 0);
  auto next = RevocationLists::Make();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(fs::exists((*lists)->dir()));
  EXPECT_FALSE(fs::exists(held)) << "once unlocked it is abandoned";
}

TEST(RevocationListsTest, ATmpDirThatCannotBeWrittenIsSaidSo) {
  TmpDirSetTo set("/nonexistent/kvtier");
  auto lists = RevocationLists::Make();
  ASSERT_FALSE(lists.ok());
  EXPECT_EQ(lists.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(lists.status().message().find("set TMPDIR to a writable one"), std::string::npos) << lists.status();
}

}  // namespace
}  // namespace kvtier
