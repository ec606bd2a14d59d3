// `kvtier run`, the real binary, against the in-process runtime.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "services/base/child_process.h"
#include "services/runtime/generate.h"
#include "services/runtime/make_model.h"

namespace kvtier::cli {
namespace {

TEST(RunCli, GreedyIdsAndLogprobsMatchTheRuntime) {
  const auto dir = std::filesystem::temp_directory_path() / ("kvtier_run_" + std::to_string(getpid()));
  ASSERT_TRUE(runtime::MakeModel(*runtime::PresetConfig("tiny"), dir.string(), 5).ok());
  const std::string kvtier = std::string(KVTIER_BINARY) + " run --model " + dir.string();
  auto text = RunCommand(kvtier + " --prompt-ids 3,1,4,1,5,9,2,6 --max-new-tokens 6 --tokens-per-block 4");
  ASSERT_EQ(text.exit_code, 0) << text.output;

  auto ckpt = runtime::Checkpoint::Open(dir.string());
  auto model = runtime::Model::Load(**ckpt);
  runtime::GenerateOptions options;
  options.max_new_tokens = 6;
  options.tokens_per_block = 4;
  auto want = runtime::Generate(**model, {3, 1, 4, 1, 5, 9, 2, 6}, options);
  ASSERT_TRUE(want.ok());
  std::string ids;
  for (const auto& s : *want) ids += (ids.empty() ? "" : " ") + std::to_string(s.token);
  EXPECT_EQ(text.output, ids + "\n");

  auto json = RunCommand(kvtier + " --prompt-ids 3,1,4,1,5,9,2,6 --max-new-tokens 6 --tokens-per-block 4 --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_NE(json.output.find("\"prompt_tokens\": 8, \"cached_tokens\": 0"), std::string::npos) << json.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(json.output, m, std::regex(R"("logprobs": \[([-0-9.e]+))")));
  EXPECT_NEAR(std::stod(m[1]), (*want)[0].logprob, 1e-6);

  // A cached prefix: two passes, the second over the first's int8 codes.
  options.codec = kernels::Codec::kInt8;
  options.cached_prefix = 4;
  auto two_passes = runtime::Generate(**model, {3, 1, 4, 1, 5, 9, 2, 6}, options);
  ASSERT_TRUE(two_passes.ok());
  auto cached = RunCommand(kvtier + " --prompt-ids 3,1,4,1,5,9,2,6 --max-new-tokens 6 --tokens-per-block 4 --json" +
                           " --kv-codec int8 --cached-prefix-tokens 4");
  ASSERT_EQ(cached.exit_code, 0) << cached.output;
  EXPECT_NE(cached.output.find("\"prompt_tokens\": 8, \"cached_tokens\": 4"), std::string::npos) << cached.output;
  ASSERT_TRUE(std::regex_search(cached.output, m, std::regex(R"("logprobs": \[([-0-9.e]+))")));
  EXPECT_NEAR(std::stod(m[1]), (*two_passes)[0].logprob, 1e-6);
  // The first token's logits saw the prefix's codes, not its floats.
  EXPECT_NE((*two_passes)[0].logprob, (*want)[0].logprob);

  struct Case {
    std::string args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {" --prompt-ids 1,256 --max-new-tokens 2", "outside the vocabulary of 256"},
           {" --prompt-ids x --max-new-tokens 2", "is not a token id"},
           {" --prompt-ids 1 --kv-codec int2", "--kv-codec int2"},
           {" --prompt-ids 1 --temperature hot", "--temperature wants a number"},
           {" --prompt-ids 1 --temperature 1 --top-p 2", "top_p must be in (0, 1]"},
           {" --prompt-ids 1 --max-new-tokens 5000", "exceeds max_position_embeddings"},
           {" --prompt-ids 1 --device tpu", "--device tpu is not one of cpu, cuda"},
           {" --prompt-ids 1,2,3,4 --tokens-per-block 2 --cached-prefix-tokens 3", "must be whole blocks of 2 tokens"},
           {" --prompt-ids 1,2,3,4 --tokens-per-block 2 --cached-prefix-tokens 4", "fewer than the prompt's 4"}}) {
    auto bad = RunCommand(kvtier + c.args);
    EXPECT_EQ(bad.exit_code, 2) << c.args << "\n" << bad.output;
    EXPECT_NE(bad.output.find(c.message), std::string::npos) << c.args << "\n" << bad.output;
  }
  auto missing = RunCommand(std::string(KVTIER_BINARY) + " run --model /nonexistent --prompt-ids 1");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("config.json"), std::string::npos) << missing.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvtier::cli
