// `kvtier make-model`, the real binary: what it writes loads, and bad flags
// are refused with a message.
#include <gtest/gtest.h>

#include <filesystem>

#include "services/base/child_process.h"
#include "services/runtime/checkpoint.h"

namespace kvtier::cli {
namespace {

TEST(MakeModelCli, WritesACheckpointThatLoads) {
  const auto dir = std::filesystem::temp_directory_path() / ("kvtier_mm_" + std::to_string(getpid()));
  auto r = RunCommand(std::string(KVTIER_BINARY) + " make-model --preset tiny --seed 3 --out " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote tiny (seed 3"), std::string::npos) << r.output;
  auto ckpt = runtime::Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->config().num_hidden_layers, 3);
  std::filesystem::remove_all(dir);

  struct Case {
    std::string args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{{"--preset huge --out /tmp/x", "unknown preset 'huge'"},
                                         {"--preset tiny", "--preset and --out are required"},
                                         {"--out /tmp/x", "--preset and --out are required"},
                                         {"--preset tiny --out /tmp/x --shards 65", "--shards must be 1..64"},
                                         {"--preset tiny --out /proc/kvtier", "cannot create"}}) {
    auto bad = RunCommand(std::string(KVTIER_BINARY) + " make-model " + c.args);
    EXPECT_NE(bad.exit_code, 0) << c.args;
    EXPECT_NE(bad.output.find(c.message), std::string::npos) << c.args << "\n" << bad.output;
  }
}

}  // namespace
}  // namespace kvtier::cli
