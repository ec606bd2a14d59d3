// The flag parser every kvtier binary shares: each spelling operators
// type, and a clear error for each way a flag is mistyped.
#include "services/base/flags.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "services/base/version.h"

namespace kvtier {
namespace {

struct Flags {
  std::string name = "default";
  uint64_t count = 7;
  bool verbose = false;
  FlagParser parser{"tool [flags]", "What the tool does."};

  Flags() {
    parser.AddString("name", &name, "a name");
    parser.AddUint("count", &count, "a count");
    parser.AddBool("verbose", &verbose, "say more");
  }
};

TEST(FlagParser, TakesEachSpelling) {
  Flags f;
  ASSERT_TRUE(f.parser.Parse({"--name", "a b", "--count=12", "--verbose"}).ok());
  EXPECT_EQ(f.name, "a b");
  EXPECT_EQ(f.count, 12u);
  EXPECT_TRUE(f.verbose);

  Flags g;
  g.verbose = true;
  ASSERT_TRUE(g.parser.Parse({"--verbose=false", "--name=", "--count", "18446744073709551615"}).ok());
  EXPECT_FALSE(g.verbose);
  EXPECT_EQ(g.name, "");
  EXPECT_EQ(g.count, UINT64_MAX);
  ASSERT_TRUE(g.parser.Parse({"--verbose=1"}).ok());
  EXPECT_TRUE(g.verbose);
  ASSERT_TRUE(g.parser.Parse({"--verbose=0"}).ok());
  EXPECT_FALSE(g.verbose);

  // After a flag that takes a value, the next argument is that value, even
  // where it looks like a flag.
  Flags h;
  ASSERT_TRUE(h.parser.Parse({"--name", "--verbose"}).ok());
  EXPECT_EQ(h.name, "--verbose");
  EXPECT_FALSE(h.verbose);

  Flags untouched;
  ASSERT_TRUE(untouched.parser.Parse({}).ok());
  EXPECT_EQ(untouched.name, "default");
  EXPECT_EQ(untouched.count, 7u);
  EXPECT_FALSE(untouched.verbose);
}

TEST(FlagParser, RefusesWhatIsMistypedAndSaysWhy) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--nmae", "x"}, "unknown flag --nmae (see --help)"},
      {{"--count=3", "--name"}, "--name needs a value"},
      {{"--count", "-3"}, "--count wants a non-negative integer, got '-3'"},
      {{"--count=12x"}, "--count wants a non-negative integer, got '12x'"},
      {{"--count="}, "--count wants a non-negative integer, got ''"},
      {{"--count=18446744073709551616"}, "--count wants a non-negative integer, got '18446744073709551616'"},
      {{"--verbose=yes"}, "--verbose wants true or false, got 'yes'"},
      {{"--verbose", "false"}, "unexpected argument 'false'"},  // a flag alone is true; it takes no value
      {{"serve"}, "unexpected argument 'serve'"},
      {{"-n"}, "unexpected argument '-n'"},
      {{"--"}, "unexpected argument '--'"},
  };
  for (const auto& [args, why] : cases) {
    Flags f;
    const absl::Status s = f.parser.Parse(args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << args.front() << ": " << s;
    EXPECT_EQ(s.message(), why) << args.front();
  }
}

TEST(FlagParser, HelpListsEveryFlagWithItsDefault) {
  Flags f;
  const std::string help = f.parser.Help();
  const std::string want[] = {
      "usage: tool [flags]\n\nWhat the tool does.\n\nflags:\n",
      "  --name\n      a name (default: default)\n",
      "  --count\n      a count (default: 7)\n",
      "  --verbose\n      say more (default: false)\n",
      "  --help\n      print this help\n  --version\n      print the version\n",
  };
  size_t at = 0;
  for (const std::string& part : want) {
    const size_t found = help.find(part, at);
    ASSERT_NE(found, std::string::npos) << "wanted, in this order:\n" << part << "\nin:\n" << help;
    at = found + part.size();
  }
}

// What a program's main does with its arguments: go on, or exit now with
// the error on stderr (2), the help or the version on stdout (0).
TEST(FlagParser, ParseOrExitSaysWhatToDoNext) {
  Flags f;
  EXPECT_EQ(f.parser.ParseOrExit({"--count", "3"}, "tool"), std::nullopt);
  EXPECT_EQ(f.count, 3u);

  Flags bad;
  testing::internal::CaptureStderr();
  EXPECT_EQ(bad.parser.ParseOrExit({"--count", "x", "--help"}, "tool"), 2) << "an error outranks --help";
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "tool: --count wants a non-negative integer, got 'x'\n");

  Flags help;
  const std::string text = help.parser.Help();
  testing::internal::CaptureStdout();
  EXPECT_EQ(help.parser.ParseOrExit({"-h"}, "tool"), 0);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), text);

  // The defaults, not what the same command line gave.
  Flags after_flags;
  testing::internal::CaptureStdout();
  EXPECT_EQ(after_flags.parser.ParseOrExit({"--count", "3", "--name=x", "--verbose", "--help"}, "tool"), 0);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), text);

  Flags version;
  testing::internal::CaptureStdout();
  EXPECT_EQ(version.parser.ParseOrExit({"--version"}, "kvtier run"), 0);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), VersionOf("kvtier") + "\n") << "a subcommand reports the CLI's";
}

}  // namespace
}  // namespace kvtier
