// The fidelity benchmark's measures (load/fidelity) on the trained model and
// a short stretch of its held-out text, in process and through the real
// services.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "load/fidelity/teacher_forced.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/make_model.h"
#include "services/runtime/tokenizer.h"
#include "tests/integration/cluster.h"
#include "tests/temp_dir.h"
#include "tests/test_random.h"

namespace kvtier::fidelity {
namespace {

constexpr char kModel[] = KVTIER_MODELS_DIR "/jargon-mla";
constexpr kernels::Codec kCodecs[] = {kernels::Codec::kBf16, kernels::Codec::kFp8, kernels::Codec::kInt8,
                                      kernels::Codec::kInt4};

class FidelityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ckpt = runtime::Checkpoint::Open(kModel);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    auto model = runtime::Model::Load(**ckpt);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    std::ifstream in(std::string(kModel) + "/heldout.txt", std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ids_ = runtime::ByteTokenizer::ForClass("ByT5Tokenizer", 259)->Encode(text.substr(0, 2048));
  }

  std::unique_ptr<runtime::Model> model_;
  std::vector<uint32_t> ids_;
};

TEST(Scores, HandWorkedPositions) {
  // ln(0.5), ln(0.25) twice: the reference; the other run puts 0.5 on id 1.
  const std::vector<float> ref = {std::log(0.5f), std::log(0.25f), std::log(0.25f)};
  const std::vector<float> other = {std::log(0.25f), std::log(0.5f), std::log(0.25f)};
  Scores same, moved;
  same.Add(ref, ref, 0);
  moved.Add(ref, other, 0);
  moved.Add(ref, other, 1);
  EXPECT_NEAR(same.Perplexity(), 2.0, 1e-6);
  EXPECT_NEAR(same.MeanKl(), 0.0, 1e-7);
  EXPECT_EQ(same.Top1Agreement(), 1.0);
  // -ln 0.25 then -ln 0.5: perplexity sqrt(4 * 2); KL 0.5 ln 2 + 0.25 ln 0.5.
  EXPECT_NEAR(moved.Perplexity(), std::sqrt(8.0), 1e-5);
  EXPECT_NEAR(moved.MeanKl(), 0.25 * std::log(2.0), 1e-6);
  EXPECT_EQ(moved.Top1Agreement(), 0.0);
}

// Blocks of 64 over 4 windows of held-out text: the trained model is far
// from guessing (259 ids); int8 and fp8 stay within the perplexity targets
// (0.5% and 1% over float); int4 costs the most. bf16 and int8 are within
// noise of each other: per-channel int8 scales can be finer than bf16's
// 8-bit mantissa (with blocks of 16 int8's KL is below bf16's), so the test
// holds them equal to 0.1% rather than ordered.
TEST_F(FidelityTest, CodecsCostInTheOrderOfTheirPrecision) {
  const Windows text{std::span(ids_).first(2048), 512};
  absl::StatusOr<std::vector<Scores>> s = ScoreInProcess(*model_, text, 64, kCodecs);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 5u);
  for (const Scores& r : *s) {
    SCOPED_TRACE(r.name);
    EXPECT_EQ(r.positions, 2044u);
    EXPECT_TRUE(std::isfinite(r.Perplexity()) && std::isfinite(r.MeanKl()));
  }
  const Scores &f = (*s)[0], &bf16 = (*s)[1], &fp8 = (*s)[2], &int8 = (*s)[3], &int4 = (*s)[4];
  EXPECT_LT(f.Perplexity(), 20.0);
  EXPECT_EQ(f.MeanKl(), 0.0);
  EXPECT_EQ(f.Top1Agreement(), 1.0);
  EXPECT_LT(int8.Perplexity(), f.Perplexity() * 1.005);
  EXPECT_LT(fp8.Perplexity(), f.Perplexity() * 1.01);
  EXPECT_NEAR(int8.Perplexity(), bf16.Perplexity(), 1e-3 * bf16.Perplexity());
  EXPECT_LT(int8.Perplexity(), int4.Perplexity());
  EXPECT_LT(bf16.Perplexity(), int4.Perplexity());
  EXPECT_LT(std::max(bf16.MeanKl(), int8.MeanKl()), fp8.MeanKl());
  EXPECT_LT(fp8.MeanKl(), int4.MeanKl());
  EXPECT_GE(bf16.Top1Agreement(), 0.99);
}

// Through the services the blocks before each position come from the cache
// (the positions before put them there): the logprobs are exactly those of
// the same passes in process, and the scores those of the one-token steps.
TEST_F(FidelityTest, ServedScoresEqualTheInProcessOnes) {
  const Windows text{std::span(ids_).first(200), 200};
  const kernels::Codec int8[] = {kernels::Codec::kInt8};
  std::vector<std::vector<float>> kept;
  absl::StatusOr<std::vector<Scores>> local = ScoreInProcess(*model_, text, 16, int8, 199, &kept);
  ASSERT_TRUE(local.ok()) << local.status();
  Cluster cluster(kModel, 1, 1, {}, "2000", {},
                  {"--kv-codec", "int8", "--tokens-per-block", "16", "--max-top-logprobs", "259"});
  ASSERT_TRUE(cluster.ok());
  uint64_t cached = 0;
  absl::StatusOr<std::vector<float>> exact = LogprobsAsServed(*model_, text, 16, kernels::Codec::kInt8, 199);
  ASSERT_TRUE(exact.ok()) << exact.status();
  absl::StatusOr<Scores> served = ScoreServed(cluster.prefill_target, text, 199, 259, kept[0], *exact, &cached);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->positions, 199u);
  EXPECT_LT(served->max_logprob_difference, 1e-4);
  EXPECT_NEAR(served->Perplexity(), (*local)[1].Perplexity(), 1e-3 * (*local)[1].Perplexity());
  EXPECT_NEAR(served->MeanKl(), (*local)[1].MeanKl(), 1e-3);
  // Position p reuses p / 16 blocks: sum over p < 199 of 16 * (p / 16).
  uint64_t want = 0;
  for (uint64_t p = 0; p < 199; ++p) want += 16 * (p / 16);
  EXPECT_EQ(cached, want);
  // Without the flag a node refuses to say every logprob.
  Cluster plain(kModel, 1, 1);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(ScoreServed(plain.prefill_target, text, 1, 259, kept[0], {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A V3-family checkpoint (make-model's v3-tiny: FP8 weights, the noaux_tc
// router, no tokenizer) on random ids, as `codec_fidelity --random-tokens`
// scores it: every codec through the services gives exactly what the same
// passes in process give over blocks from the cache.
TEST(FidelityV3, ServedScoresEqualTheInProcessOnes) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  testing::TempDir dir("kvtier_fidelity_v3");
  const runtime::ModelConfig config = *runtime::PresetConfig("v3-tiny");
  ASSERT_TRUE(runtime::MakeModel(config, dir.path().string(), rng.seed(), 3).ok());
  auto ckpt = runtime::Checkpoint::Open(dir.path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto model = runtime::Model::Load(**ckpt);
  ASSERT_TRUE(model.ok()) << model.status();
  const uint32_t vocab = static_cast<uint32_t>(config.vocab_size);
  std::vector<uint32_t> ids(100);
  for (uint32_t& t : ids) t = static_cast<uint32_t>(rng.engine()() % vocab);
  const Windows text{ids, 100};
  std::vector<std::vector<float>> kept;
  absl::StatusOr<std::vector<Scores>> local = ScoreInProcess(**model, text, 16, kCodecs, 99, &kept);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_GE((*local)[1].Top1Agreement(), 0.9) << "bf16 latents keep the float model's choices";
  for (size_t c = 0; c < std::size(kCodecs); ++c) {
    SCOPED_TRACE(kernels::CodecName(kCodecs[c]));
    Cluster cluster(dir.path().string(), 1, 1, {}, "2000", {},
                    {"--kv-codec", kernels::CodecName(kCodecs[c]), "--tokens-per-block", "16", "--max-top-logprobs",
                     std::to_string(vocab)});
    ASSERT_TRUE(cluster.ok());
    uint64_t cached = 0;
    absl::StatusOr<std::vector<float>> exact = LogprobsAsServed(**model, text, 16, kCodecs[c], 99);
    ASSERT_TRUE(exact.ok()) << exact.status();
    absl::StatusOr<Scores> served = ScoreServed(cluster.prefill_target, text, 99, vocab, kept[0], *exact, &cached);
    ASSERT_TRUE(served.ok()) << served.status();
    // The node computes what LogprobsAsServed does, bit for bit on the CPU.
    // Not compared with the one-token steps of ScoreInProcess: a node runs
    // a prompt's uncached tokens as one pass, and where a token's router
    // scores nearly tie the other rounding can choose another expert (seen:
    // 0.21 in one int4 logprob).
    EXPECT_LT(served->max_logprob_difference, 1e-4);
    EXPECT_GT(cached, 0u);
  }
}

}  // namespace
}  // namespace kvtier::fidelity
