// The byte tokenizer and how a checkpoint names its tokenizer.
#include "services/runtime/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "services/runtime/checkpoint.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model.h"
#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

namespace fs = std::filesystem;

TEST(ByteTokenizer, EncodesEachByteAndDecodesBack) {
  absl::StatusOr<ByteTokenizer> t = ByteTokenizer::ForClass("ByT5Tokenizer", 259);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Encode("Hi\n"), (std::vector<uint32_t>{'H' + 3, 'i' + 3, '\n' + 3}));
  // "é" is two bytes; every byte value survives a round trip.
  EXPECT_EQ(t->Encode("\xC3\xA9"), (std::vector<uint32_t>{0xC3 + 3, 0xA9 + 3}));
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::uniform_int_distribution<int> byte(0, 127);
  std::string ascii(200, ' ');
  for (char& c : ascii) c = static_cast<char>(byte(rng.engine()));
  EXPECT_EQ(t->Decode(t->Encode(ascii)), ascii);
  const std::string text = "caf\xC3\xA9 \xE2\x80\x94 \xF0\x9F\x99\x82";
  EXPECT_EQ(t->Decode(t->Encode(text)), text);
}

TEST(ByteTokenizer, DecodeDropsSpecialIdsAndReplacesBrokenCharacters) {
  const ByteTokenizer t = *ByteTokenizer::ForClass("ByT5Tokenizer", 300);
  const uint32_t a = 'a' + 3;
  EXPECT_EQ(t.Decode(std::vector<uint32_t>{ByteTokenizer::kPad, a, ByteTokenizer::kEos, a, ByteTokenizer::kUnk, 299}),
            "aa");
  const std::string replacement = "\xEF\xBF\xBD";
  // A multibyte character cut off, a stray continuation byte, an overlong
  // form and a surrogate print as U+FFFD, one for each maximal start of a
  // character (as Python's decoder does), the rest as it is.
  EXPECT_EQ(t.Decode(t.Encode("x\xC3")), "x" + replacement);
  EXPECT_EQ(t.Decode(t.Encode("\xE2\x80"
                              "a\xF0\x9F\x99")),
            replacement + "a" + replacement);
  EXPECT_EQ(t.Decode(t.Encode("\xA9y")), replacement + "y");
  EXPECT_EQ(t.Decode(t.Encode("\xC0\xAF")), replacement + replacement);
  EXPECT_EQ(t.Decode(t.Encode("\xED\xA0\x80")), replacement + replacement + replacement);
}

TEST(ByteTokenizer, RefusesOtherTokenizersAndSmallVocabularies) {
  EXPECT_EQ(ByteTokenizer::ForClass("", 259).status().code(), absl::StatusCode::kFailedPrecondition);
  absl::Status other = ByteTokenizer::ForClass("LlamaTokenizerFast", 259).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(other.message().find("LlamaTokenizerFast"), std::string::npos) << other;
  EXPECT_EQ(ByteTokenizer::ForClass("ByT5Tokenizer", 258).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseTokenizerClass, NamesTheClassOrNothing) {
  EXPECT_EQ(*ParseTokenizerClass(R"({"tokenizer_class": "ByT5Tokenizer", "extra_ids": 0})"), "ByT5Tokenizer");
  EXPECT_EQ(*ParseTokenizerClass(R"({"extra_ids": 0})"), "");  // the class left to tokenizer.json
  for (const char* bad : {"{", "[]", R"({"tokenizer_class": 7})"}) {
    EXPECT_EQ(ParseTokenizerClass(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// A checkpoint carries its tokenizer's class to the model (none without a
// tokenizer_config.json); a broken one stops the load with the file's name.
TEST(ParseTokenizerClass, CheckpointsAndModelsCarryIt) {
  const fs::path dir = fs::temp_directory_path() / ("kvtier_tokenizer_model_" + std::to_string(getpid()));
  ASSERT_TRUE(MakeModel(*PresetConfig("tiny"), dir.string(), 1).ok());
  EXPECT_EQ((*Checkpoint::Open(dir.string()))->tokenizer_class(), "");
  std::ofstream(dir / "tokenizer_config.json") << R"({"tokenizer_class": "ByT5Tokenizer"})";
  auto ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->tokenizer_class(), "ByT5Tokenizer");
  EXPECT_EQ((*Model::Load(**ckpt))->tokenizer_class(), "ByT5Tokenizer");
  std::ofstream(dir / "tokenizer_config.json") << "{";
  const absl::Status broken = Checkpoint::Open(dir.string()).status();
  EXPECT_EQ(broken.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(broken.message().find("tokenizer_config.json"), std::string::npos) << broken;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvtier::runtime
