#include "services/base/byte_size.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/temp_dir.h"

namespace kvtier {
namespace {

TEST(ParseByteSize, TakesWhatOperatorsWrite) {
  const std::pair<std::string, uint64_t> cases[] = {
      {"1073741824", 1073741824},
      {"512MiB", 512ull << 20},
      {"4GiB", 4ull << 30},
      {"4Gi", 4ull << 30},
      {"4G", 4'000'000'000ull},
      {"64K", 64'000},
      {"64kb", 64'000},
      {"1.5GiB", 3ull << 29},
      {"1GB", 1'000'000'000},
      {"1.5TB", 1'500'000'000'000ull},
      {"2ki", 2048},
      {"0.5Mi", 512ull << 10},
      {"2TiB", 2ull << 40},
      {"10B", 10},
      {"0.1KiB", 102},
  };
  for (const auto& [text, bytes] : cases) {
    absl::StatusOr<uint64_t> parsed = ParseByteSize(text);
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status();
    EXPECT_EQ(*parsed, bytes) << text;
  }
}

TEST(ParseByteSize, RefusesWhatIsNotASizeAndSaysWhy) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "not a size"},           {"GiB", "not a size"},
      {"1.GiB", "not a size"},      {"1.5.5GiB", "unknown unit"},
      {"4PiB", "unknown unit"},     {"4iB", "unknown unit"},
      {"4 GiB", "unknown unit"},    {"-4GiB", "not a size"},
      {"16777216TiB", "too large"}, {"99999999999999999999", "not a size"},
      {"4GIBB", "powers of 1024"},  {"4Gb2", "powers of 1000"},
      {"1..5GiB", "not a size"},    {"1.0000000001GiB", "not a size"},
  };
  for (const auto& [text, why] : cases) {
    absl::StatusOr<uint64_t> parsed = ParseByteSize(text);
    ASSERT_FALSE(parsed.ok()) << "'" << text << "' parsed as " << *parsed;
    EXPECT_NE(parsed.status().message().find(why), std::string::npos) << text << ": " << parsed.status();
  }
}

TEST(ParseByteSizeFlag, NamesTheFlagInItsError) {
  EXPECT_EQ(*ParseByteSizeFlag("record-pool", "2MiB"), uint64_t{2} << 20);
  const absl::StatusOr<uint64_t> bad = ParseByteSizeFlag("record-pool", "zz");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "--record-pool: 'zz' is not a size like 4GiB, 4Gi or 1.5GiB");
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text << "\n"; }

TEST(ProcessMemoryLimit, IsTheCgroupsWhereItIsBelowTheMachines) {
  testing::TempDir root("kvtier-cgroup");
  const MemoryLimit machine = ProcessMemoryLimit(root.path().string());  // no cgroup files there
  EXPECT_FALSE(machine.from_cgroup);
  EXPECT_GT(machine.bytes, 0u);
  WriteFile((root.path() / "memory.max").string(), "max");  // v2, no limit
  EXPECT_EQ(ProcessMemoryLimit(root.path().string()).bytes, machine.bytes);
  WriteFile((root.path() / "memory.max").string(), "536870912");  // a container's 512Mi
  MemoryLimit limit = ProcessMemoryLimit(root.path().string());
  EXPECT_TRUE(limit.from_cgroup);
  EXPECT_EQ(limit.bytes, 536870912u);
  std::filesystem::remove((root.path() / "memory.max").string());
  std::filesystem::create_directory((root.path() / "memory").string());
  WriteFile((root.path() / "memory" / "memory.limit_in_bytes").string(), "9223372036854771712");  // v1, no limit
  EXPECT_FALSE(ProcessMemoryLimit(root.path().string()).from_cgroup);
  WriteFile((root.path() / "memory" / "memory.limit_in_bytes").string(), "1073741824");
  EXPECT_EQ(ProcessMemoryLimit(root.path().string()).bytes, 1073741824u);
}

}  // namespace
}  // namespace kvtier
