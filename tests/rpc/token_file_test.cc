// TokenFile: a client's bearer token follows its file, read again once
// `reload` has passed; a file that becomes unusable keeps the last good
// token, and what is logged names the file, never a token.
#include "services/rpc/token_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "absl/time/clock.h"
#include "services/base/log.h"
#include "tests/integration/test_tenants.h"
#include "tests/temp_dir.h"

namespace kvtier {
namespace {

using testing::WriteAtomically;

TEST(TokenFile, OpenTakesTheFirstLineAndRefusesAFileWithoutOne) {
  testing::TempDir dir("kvtier-token-");
  const std::string path = (dir.path() / "token").string();
  EXPECT_EQ(TokenFile::Open(path, absl::Seconds(10)).status().message(),
            "--token-file: cannot read " + path + ": No such file or directory");
  for (const std::string empty : {"", "\n", "  \t\nsecond line\n"}) {
    WriteAtomically(path, empty);
    EXPECT_EQ(TokenFile::Open(path, absl::Seconds(10)).status().message(), "--token-file: " + path + " is empty")
        << "'" << empty << "'";
  }
  WriteAtomically(path, " secret-1 \nsecond line\n");
  absl::StatusOr<std::shared_ptr<TokenFile>> token = TokenFile::Open(path, absl::Seconds(10));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*(*token)->Header(), "Bearer secret-1");
}

TEST(TokenFile, TheFileIsReadAgainOnlyOnceTheReloadPeriodHasPassed) {
  testing::TempDir dir("kvtier-token-");
  const std::string path = (dir.path() / "token").string();
  WriteAtomically(path, "secret-1\n");
  std::shared_ptr<TokenFile> hourly = *TokenFile::Open(path, absl::Hours(1));
  std::shared_ptr<TokenFile> often = *TokenFile::Open(path, absl::Milliseconds(1));
  WriteAtomically(path, "secret-2\n");
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(*hourly->Header(), "Bearer secret-1");
  EXPECT_EQ(*often->Header(), "Bearer secret-2");
}

TEST(TokenFile, AFileThatBecomesUnusableKeepsTheLastGoodTokenAndIsLoggedOnce) {
  testing::TempDir dir("kvtier-token-");
  const std::filesystem::path path = dir.path() / "token";
  WriteAtomically(path, "secret-1\n");
  std::shared_ptr<TokenFile> token = *TokenFile::Open(path.string(), absl::Milliseconds(1));
  SetLogProgram("kvtier-test");
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    WriteAtomically(path, "\n");
    absl::SleepFor(absl::Milliseconds(5));
    EXPECT_EQ(*token->Header(), "Bearer secret-1");
  }
  std::filesystem::remove(path);
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(*token->Header(), "Bearer secret-1");
  WriteAtomically(path, "secret-2\n");
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(*token->Header(), "Bearer secret-2");
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string p = path.string();
  EXPECT_EQ(log, "kvtier-test: error: auth: --token-file: " + p + " is empty: the last good token stays in force\n" +
                     "kvtier-test: error: auth: --token-file: cannot read " + p +
                     ": No such file or directory: the last good token stays in force\n" +
                     "kvtier-test: auth: --token-file " + p + ": a new token is in force\n");
  EXPECT_EQ(log.find("secret"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
