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
