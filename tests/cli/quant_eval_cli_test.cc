// Runs the real `kvtier quant-eval` binary: the --json contract, the table,
// and clear errors with the right exit codes on bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "services/base/child_process.h"
#include "services/cli/quant_eval.h"
#include "tests/test_random.h"

namespace kvtier::cli {
namespace {

CommandResult RunKvtier(const std::string& args) { return RunCommand(std::string(KVTIER_BINARY) + " " + args); }

class QuantEvalCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kvtier_quant_eval_" + std::to_string(rng_.seed()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteFile(const std::string& name, const std::vector<float>& v) {
    const auto path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    return path;
  }

  testing::SeededRng rng_;
  std::filesystem::path dir_;
};

double JsonField(const std::string& json, const std::string& key) {
  std::smatch m;
  const std::regex re("\"" + key + "\": ([-0-9.eE+]+)");
  EXPECT_TRUE(std::regex_search(json, m, re)) << key << " missing in " << json;
  return m.empty() ? NAN : std::stod(m[1]);
}

TEST_F(QuantEvalCliTest, JsonMatchesTheLibraryOnAFile) {
  SCOPED_TRACE(rng_.Trace());
  const LatentRows rows = MakeSyntheticLatents(300, 512, 64, rng_.seed());
  const std::string path = WriteFile("latents.f32", rows.values);
  for (const char* codec : {"bf16", "fp8", "int8", "int4"}) {
    CommandResult r = RunKvtier("quant-eval --input " + path + " --dim 576 --codec " + codec + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(std::string("\"codec\": \"") + codec + "\""), std::string::npos) << r.output;
    absl::StatusOr<SchemeResult> want = EvaluateCodec(*kernels::ParseCodec(codec), rows, 64);
    ASSERT_TRUE(want.ok());
    EXPECT_NEAR(JsonField(r.output, "bytes_per_token"), want->bytes_per_token, 1e-6);
    EXPECT_NEAR(JsonField(r.output, "latent_rel_error"), want->latent_rel_error, 1e-8);
    EXPECT_NEAR(JsonField(r.output, "rope_rel_error"), want->rope_rel_error, 1e-8);
  }
}

TEST_F(QuantEvalCliTest, SyntheticPrintsTheComparisonTable) {
  CommandResult r = RunKvtier("quant-eval --synthetic --tokens 512 --codec int4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* row : {"int8 per-tensor", "int8 per-token", "int8 per-channel", "int4 symmetric per-channel",
                          "int4 asymmetric per-channel", "fp8", "bf16"}) {
    EXPECT_NE(r.output.find(row), std::string::npos) << row << " missing:\n" << r.output;
  }
  EXPECT_NE(r.output.find("codec int4: 324.0 bytes/token/layer"), std::string::npos) << r.output;
}

TEST_F(QuantEvalCliTest, BadInputGetsAClearErrorAndExitCode) {
  const std::string odd = WriteFile("odd.f32", std::vector<float>(577, 1.0f));
  const std::string nan = WriteFile("nan.f32", std::vector<float>(576, NAN));
  struct Case {
    std::string args;
    int exit_code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"quant-eval --input " + odd + " --dim 576", 2, "not a positive multiple of a row"},
      {"quant-eval --input " + nan + " --dim 576", 2, "non-finite input"},
      {"quant-eval --input /nonexistent/file --dim 576", 1, "cannot open"},
      {"quant-eval --synthetic --codec int2", 2, "not one of bf16, fp8, int8, int4"},
      {"quant-eval --synthetic --input " + odd, 2, "exactly one of"},
      {"quant-eval", 2, "exactly one of"},
      {"quant-eval --synthetic --rope-dim 600", 2, "--rope-dim"},
      {"quant-eval --synthetic --tokens-per-block 0", 2, "--tokens-per-block"},
      {"quant-eval --synthetic --bogus", 2, "unknown flag --bogus"},
      {"quant-eval --synthetic --tokens abc", 2, "non-negative integer"},
      {"no-such-command", 2, "unknown command"},
  };
  for (const Case& c : cases) {
    CommandResult r = RunKvtier(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST_F(QuantEvalCliTest, HelpExplainsTheFlags) {
  CommandResult r = RunKvtier("quant-eval --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag :
       {"--input", "--dim", "--codec", "--rope-dim", "--tokens-per-block", "--json", "--synthetic"}) {
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
  }
  EXPECT_EQ(RunKvtier("--help").exit_code, 0);
}

}  // namespace
}  // namespace kvtier::cli
