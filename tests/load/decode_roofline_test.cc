// decode_bench's roofline bytes against the lite-attn preset's weights and
// latents counted by hand from DeepSeek-V2's layout and the codecs' byte
// layouts (kernels/codec.h).
#include "load/decode_roofline.h"

#include <gtest/gtest.h>

#include "services/runtime/make_model.h"

namespace kvtier::load {
namespace {

using kernels::Codec;

// lite-attn: hidden 2048, 16 heads (nope 128, rope 64, v 128), kv rank
// 512, vocab 1024; layer 0 dense (intermediate 1024), layer 1 MoE (8
// routed experts, top 2, and 2 shared, each 256 wide).
constexpr double kAttention = 2048.0               // input_layernorm
                              + 16.0 * 192 * 2048  // q_proj
                              + 576.0 * 2048       // kv_a_proj_with_mqa
                              + 512                // kv_a_layernorm
                              + 16.0 * 256 * 512   // kv_b_proj
                              + 2048.0 * 16 * 128  // o_proj
                              + 2048;              // post_attention_layernorm
constexpr double kDenseMlp = 3.0 * 2048 * 1024;
constexpr double kRouter = 8.0 * 2048;
constexpr double kExpert = 3.0 * 2048 * 256;
constexpr double kShared = 3.0 * 2048 * 512;
constexpr double kEnd = 2048.0 + 1024.0 * 2048;  // final norm, lm_head

double LiteAttnWeightBytes(size_t sequences, int experts) {
  return 2 * (2 * kAttention + kDenseMlp + kRouter + experts * kExpert + kShared + kEnd + sequences * 2048.0);
}

TEST(DecodeRooflineTest, WeightsCountTheExpertsABatchCanChoose) {
  const runtime::ModelConfig c = *runtime::PresetConfig("lite-attn");
  EXPECT_DOUBLE_EQ(DecodeStepBytes(c, 1, 2048, Codec::kInt8, 64).weights, LiteAttnWeightBytes(1, 2));
  EXPECT_DOUBLE_EQ(DecodeStepBytes(c, 3, 2048, Codec::kInt8, 64).weights, LiteAttnWeightBytes(3, 6));
  EXPECT_DOUBLE_EQ(DecodeStepBytes(c, 4, 2048, Codec::kInt8, 64).weights, LiteAttnWeightBytes(4, 8));
  EXPECT_DOUBLE_EQ(DecodeStepBytes(c, 64, 2048, Codec::kInt8, 64).weights, LiteAttnWeightBytes(64, 8));
}

// With FP8 projections (1 byte, and a float scale per 128 x 128 block, edge
// blocks partial): q_proj [3072, 2048] 24 x 16 scales, kv_a [576, 2048]
// 5 x 16, kv_b [4096, 512] 32 x 4, o_proj [2048, 2048] 16 x 16, the dense
// MLP's [1024, 2048] 8 x 16 twice and [2048, 1024] 16 x 8, an expert's
// [256, 2048] 2 x 16 twice and [2048, 256] 16 x 2, the shared [512, 2048]
// 4 x 16 twice and [2048, 512] 16 x 4. Norms, router, embeddings and
// lm_head stay bf16.
TEST(DecodeRooflineTest, Fp8ProjectionsCountOneByteAndTheirScales) {
  runtime::ModelConfig c = *runtime::PresetConfig("lite-attn");
  c.fp8 = runtime::Fp8Quantization{128, 128};
  const double projections = 16.0 * 192 * 2048 + 576.0 * 2048 + 16.0 * 256 * 512 + 2048.0 * 16 * 128;
  const double norms = 2048.0 + 512 + 2048;
  const double attention_scales = 24 * 16 + 5 * 16 + 32 * 4 + 16 * 16;
  const double dense_scales = 8 * 16 * 2 + 16 * 8, expert_scales = 2 * 16 * 2 + 16 * 2,
               shared_scales = 4 * 16 * 2 + 16 * 4;
  const auto want = [&](size_t sequences, int experts) {
    return 2 * (projections + 2 * norms + 4 * attention_scales) + kDenseMlp + 4 * dense_scales + 2 * kRouter +
           experts * (kExpert + 4 * expert_scales) + kShared + 4 * shared_scales + 2 * (kEnd + sequences * 2048.0);
  };
  EXPECT_DOUBLE_EQ(DecodeStepBytes(c, 1, 2048, Codec::kInt8, 64).weights, want(1, 2));
  EXPECT_DOUBLE_EQ(DecodeStepBytes(c, 64, 2048, Codec::kInt8, 64).weights, want(64, 8));
  EXPECT_LT(want(1, 2), 0.55 * LiteAttnWeightBytes(1, 2)) << "about half: lm_head and the rest stay bf16";
}

TEST(DecodeRooflineTest, LatentsAreWholeBlocksInTheCodecAndAFloatTail) {
  const runtime::ModelConfig c = *runtime::PresetConfig("lite-attn");
  // int8: 576 bf16 scales, then 64 x 576 one-byte codes; bf16: 64 x 576 x 2.
  const double int8_block = 576.0 * 2 + 64.0 * 576, bf16_block = 64.0 * 576 * 2;
  const double tail_token = 576.0 * 4;
  EXPECT_DOUBLE_EQ(DecodeStepBytes(c, 8, 2048, Codec::kInt8, 64).latents, 8 * 2 * 32 * int8_block);
  EXPECT_DOUBLE_EQ(DecodeStepBytes(c, 8, 2058, Codec::kInt8, 64).latents, 8 * 2 * (32 * int8_block + 10 * tail_token));
  EXPECT_DOUBLE_EQ(DecodeStepBytes(c, 1, 100, Codec::kBf16, 64).latents, 2 * (bf16_block + 36 * tail_token));
  EXPECT_DOUBLE_EQ(DecodeStepBytes(c, 1, 63, Codec::kInt8, 64).latents, 2 * 63 * tail_token);
}

}  // namespace
}  // namespace kvtier::load
