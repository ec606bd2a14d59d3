// The log facility: one line a message in the documented shape, and a
// rate-limited message said once an interval with the count held back.
#include "services/base/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace kvtier {
namespace {

// What `write` printed on stderr.
template <typename F>
std::string Captured(F write) {
  std::FILE* file = std::tmpfile();
  const int saved = dup(STDERR_FILENO);
  dup2(fileno(file), STDERR_FILENO);
  write();
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string out;
  std::rewind(file);
  for (int c; (c = std::fgetc(file)) != EOF;) out.push_back(static_cast<char>(c));
  std::fclose(file);
  return out;
}

TEST(Log, OneLineAMessageWithProgramLevelAndComponent) {
  SetLogProgram("kvtier-test");
  const std::string out = Captured([] {
    Log(LogLevel::kInfo, "store", "ready");
    Log(LogLevel::kWarning, "disk", "full");
    Log(LogLevel::kError, "", "stopped");
  });
  EXPECT_EQ(out, "kvtier-test: store: ready\nkvtier-test: warning: disk: full\nkvtier-test: error: stopped\n");
}

TEST(RateLimitedLog, SaysItOnceAnIntervalWithTheCountHeldBack) {
  SetLogProgram("kvtier-test");
  ManualClock clock;
  RateLimitedLog log(LogLevel::kWarning, "disk", absl::Seconds(10), &clock);
  const std::string out = Captured([&] {
    log("write failed");  // said
    for (int i = 0; i < 5; ++i) {
      clock.Advance(absl::Seconds(1));
      log("write failed");  // held back
    }
    clock.Advance(absl::Seconds(5));
    log("write failed");  // 10 s on: said, with the 5
    log("write failed");  // held back again
  });
  EXPECT_EQ(out,
            "kvtier-test: warning: disk: write failed\n"
            "kvtier-test: warning: disk: write failed (and 5 more like it since it was last said)\n");
}

}  // namespace
}  // namespace kvtier
