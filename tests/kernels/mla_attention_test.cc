// Absorbed MLA decode attention: (1) over every codec's stored blocks it
// equals float64 attention over the dequantized latents, with the same bits
// when its heads are split over threads, and so does its portable path (no
// VNNI, AVX2 or AVX-512 tiles); (2) with W_UK and
// W_UV folded in it equals the naive expanded-K/V attention.
#include "kvtier/kernels/mla_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/mla_attention_float.h"
#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/parallel.h"
#include "tests/test_random.h"

namespace kvtier::kernels {
namespace {

struct Context {
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<LatentBlock> blocks;
  std::vector<float> tail;
  std::vector<double> latents;  // every token, dequantized, for references
};

Context MakeContext(Codec codec, const MlaShape& s, std::vector<uint32_t> block_tokens, uint32_t tail_tokens,
                    std::mt19937_64& rng) {
  const uint32_t dim = s.kv_lora_rank + s.rope_dim;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Context ctx;
  ctx.payloads.reserve(block_tokens.size());
  for (uint32_t tokens : block_tokens) {
    const BlockShape shape{tokens, s.kv_lora_rank, s.rope_dim};
    std::vector<float> x(shape.values());
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = normal(rng) * (i % dim == 3 ? 20.0f : 1.0f) + (i % dim == 5 ? 4.0f : 0.0f);
    std::vector<uint8_t> payload(EncodedBytes(codec, shape));
    EXPECT_TRUE(Quantize(codec, shape, x, payload).ok());
    std::vector<float> back(x.size());
    EXPECT_TRUE(Dequantize(codec, shape, payload, back).ok());
    ctx.latents.insert(ctx.latents.end(), back.begin(), back.end());
    ctx.payloads.push_back(std::move(payload));
    ctx.blocks.push_back({codec, tokens, ctx.payloads.back()});
  }
  ctx.tail.resize(size_t{tail_tokens} * dim);
  for (float& v : ctx.tail) v = normal(rng);
  ctx.latents.insert(ctx.latents.end(), ctx.tail.begin(), ctx.tail.end());
  return ctx;
}

// Softmax attention in double over explicit latents.
std::vector<double> Reference(const MlaShape& s, const std::vector<float>& q_latent, const std::vector<float>& q_rope,
                              double scale, const std::vector<double>& latents) {
  const uint32_t dim = s.kv_lora_rank + s.rope_dim;
  const size_t tokens = latents.size() / dim;
  std::vector<double> out(size_t{s.heads} * s.kv_lora_rank, 0.0);
  for (uint32_t h = 0; h < s.heads; ++h) {
    std::vector<double> score(tokens);
    double max = -INFINITY;
    for (size_t t = 0; t < tokens; ++t) {
      double v = 0;
      for (uint32_t c = 0; c < s.kv_lora_rank; ++c)
        v += double{q_latent[h * s.kv_lora_rank + c]} * latents[t * dim + c];
      for (uint32_t c = 0; c < s.rope_dim; ++c)
        v += double{q_rope[h * s.rope_dim + c]} * latents[t * dim + s.kv_lora_rank + c];
      max = std::max(max, score[t] = v * scale);
    }
    double sum = 0;
    for (double& v : score) sum += (v = std::exp(v - max));
    for (size_t t = 0; t < tokens; ++t) {
      for (uint32_t c = 0; c < s.kv_lora_rank; ++c)
        out[h * s.kv_lora_rank + c] += score[t] / sum * latents[t * dim + c];
    }
  }
  return out;
}

std::vector<float> RandomVector(size_t n, std::mt19937_64& rng, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

class AbsorbedMlaTest : public ::testing::TestWithParam<Codec> {};

TEST_P(AbsorbedMlaTest, EqualsFloat64AttentionOverTheDequantizedLatents) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  // Head counts that fill 16, 8 and 4 lanes of the int8 kernels' passes
  // (20 = 16 + 4), V2-Lite's dims among them, a kv whose last 64-channel
  // chunk of the float tiles reaches past a row's end (80 + 16: under ASan
  // a read past the tail's last row fails), and a dim the float tiles take
  // but not the int8 integer path or the int4 widening (64 + 16, not a
  // multiple of 32: int8 and int4 codes widened token by token).
  for (const MlaShape& s : {MlaShape{4, 48, 16}, MlaShape{16, 512, 64}, MlaShape{8, 128, 32}, MlaShape{20, 64, 32},
                            MlaShape{4, 80, 16}, MlaShape{4, 64, 16}}) {
    // A full block, one longer than the int8 kernels' span of 256 tokens
    // (odd: its last pair has one token), a partial last block and a float
    // tail of more than two of the 128-token chunks it is read in.
    Context ctx = MakeContext(GetParam(), s, {64, 301, 17}, 261, rng.engine());
    const std::vector<float> q_latent = RandomVector(size_t{s.heads} * s.kv_lora_rank, rng.engine(), 0.3f);
    const std::vector<float> q_rope = RandomVector(size_t{s.heads} * s.rope_dim, rng.engine(), 0.3f);
    const float scale = 1.0f / std::sqrt(192.0f);
    std::vector<float> out(size_t{s.heads} * s.kv_lora_rank, NAN);
    ASSERT_TRUE(AbsorbedMlaDecode(s, q_latent, q_rope, scale, ctx.blocks, ctx.tail, out).ok());
    const std::vector<double> want = Reference(s, q_latent, q_rope, scale, ctx.latents);
    // int8 blocks take the VNNI path, which rounds the query and the
    // attention weights to int16 (relative 2^-16 of the largest value per
    // head and block, mla_attention_int8.h); over 512 + 64 channels that
    // reached 1.3e-4 in 150 runs of this test (median 3e-5), past the 1e-4
    // the float paths keep to, so int8 gets 4e-4.
    const double tolerance = GetParam() == Codec::kInt8 ? 4e-4 : 1e-4;
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_NEAR(out[i], want[i], tolerance * (1 + std::fabs(want[i]))) << "heads " << s.heads << " i " << i;
    }
    // Heads split over the kernel threads give the same bits.
    std::vector<float> split(out.size(), NAN);
    SetKernelThreads(3);
    const Status st = AbsorbedMlaDecode(s, q_latent, q_rope, scale, ctx.blocks, ctx.tail, split);
    SetKernelThreads(1);
    ASSERT_TRUE(st.ok());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(split[i], out[i]) << "heads " << s.heads << " i " << i;
    // The portable path (CPUs without AVX2) within the float paths' bound.
    std::vector<float> portable(out.size(), NAN);
    SetAttentionTilesForTesting(false);
    const Status pst = AbsorbedMlaDecode(s, q_latent, q_rope, scale, ctx.blocks, ctx.tail, portable);
    SetAttentionTilesForTesting(true);
    ASSERT_TRUE(pst.ok());
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_NEAR(portable[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << "portable, heads " << s.heads << " i " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, AbsorbedMlaTest, ::testing::ValuesIn(kAllCodecs),
                         [](const auto& info) { return std::string(CodecName(info.param)); });

TEST(AbsorbedMla, EqualsNaiveExpandedAttention) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const uint32_t heads = 4, kv = 64, rope = 16, nope = 32, vdim = 24;
  const MlaShape s{heads, kv, rope};
  // bf16 blocks of bf16-exact latents plus a tail: exactly what the naive
  // model sees.
  Context ctx = MakeContext(Codec::kBf16, s, {64, 30}, 11, rng.engine());
  const size_t tokens = ctx.latents.size() / (kv + rope);
  const auto w_uk = RandomVector(size_t{heads} * nope * kv, rng.engine(), 0.125f);  // [h][nope][kv]
  const auto w_uv = RandomVector(size_t{heads} * vdim * kv, rng.engine(), 0.125f);  // [h][v][kv]
  const auto q_nope = RandomVector(size_t{heads} * nope, rng.engine(), 1.0f);
  const auto q_rope = RandomVector(size_t{heads} * rope, rng.engine(), 0.3f);
  const double scale = 1.0 / std::sqrt(double{nope + rope});

  // Naive: expand K and V per head, in double.
  std::vector<double> naive(size_t{heads} * vdim, 0.0);
  for (uint32_t h = 0; h < heads; ++h) {
    std::vector<double> score(tokens);
    double max = -INFINITY;
    for (size_t t = 0; t < tokens; ++t) {
      const double* c = ctx.latents.data() + t * (kv + rope);
      double v = 0;
      for (uint32_t i = 0; i < nope; ++i) {
        double k = 0;
        for (uint32_t j = 0; j < kv; ++j) k += double{w_uk[(h * nope + i) * kv + j]} * c[j];
        v += double{q_nope[h * nope + i]} * k;
      }
      for (uint32_t j = 0; j < rope; ++j) v += double{q_rope[h * rope + j]} * c[kv + j];
      max = std::max(max, score[t] = v * scale);
    }
    double sum = 0;
    for (double& v : score) sum += (v = std::exp(v - max));
    for (size_t t = 0; t < tokens; ++t) {
      const double* c = ctx.latents.data() + t * (kv + rope);
      for (uint32_t i = 0; i < vdim; ++i) {
        double v = 0;
        for (uint32_t j = 0; j < kv; ++j) v += double{w_uv[(h * vdim + i) * kv + j]} * c[j];
        naive[h * vdim + i] += score[t] / sum * v;
      }
    }
  }
  // Absorbed: W_UK folded into the query, W_UV applied to the latent sum.
  std::vector<float> q_latent(size_t{heads} * kv);
  for (uint32_t h = 0; h < heads; ++h) {
    for (uint32_t j = 0; j < kv; ++j) {
      double v = 0;
      for (uint32_t i = 0; i < nope; ++i) v += double{w_uk[(h * nope + i) * kv + j]} * q_nope[h * nope + i];
      q_latent[h * kv + j] = static_cast<float>(v);
    }
  }
  std::vector<float> out(size_t{heads} * kv);
  ASSERT_TRUE(AbsorbedMlaDecode(s, q_latent, q_rope, static_cast<float>(scale), ctx.blocks, ctx.tail, out).ok());
  for (uint32_t h = 0; h < heads; ++h) {
    for (uint32_t i = 0; i < vdim; ++i) {
      double v = 0;
      for (uint32_t j = 0; j < kv; ++j) v += double{w_uv[(h * vdim + i) * kv + j]} * out[h * kv + j];
      ASSERT_NEAR(v, naive[h * vdim + i], 1e-4 * (1 + std::fabs(naive[h * vdim + i]))) << h << "/" << i;
    }
  }
}

TEST(AbsorbedMla, RejectsBadSizes) {
  const MlaShape s{2, 8, 4};
  std::vector<float> q(16), qr(8), out(16), tail(12);
  EXPECT_TRUE(AbsorbedMlaDecode(s, q, qr, 1.0f, {}, tail, out).ok());
  EXPECT_EQ(AbsorbedMlaDecode(s, q, qr, 1.0f, {}, {}, out).code(), StatusCode::kInvalidArgument) << "no context";
  std::vector<float> odd_tail(13);
  EXPECT_EQ(AbsorbedMlaDecode(s, q, qr, 1.0f, {}, odd_tail, out).code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> payload(10);
  const LatentBlock bad{Codec::kInt8, 4, payload};
  EXPECT_EQ(AbsorbedMlaDecode(s, q, qr, 1.0f, std::span(&bad, 1), tail, out).code(), StatusCode::kInvalidArgument);
  std::vector<float> short_q(15);
  EXPECT_EQ(AbsorbedMlaDecode(s, short_q, qr, 1.0f, {}, tail, out).code(), StatusCode::kInvalidArgument);
}

// The float tiles widen fp8 blocks 16 codes at a time: every one of the
// 256 codes, in both tiles of a token and in the tile tail, gives the
// codec's Fp8E4m3ToFloat(code) * scale, NaN codes included.
TEST(FloatTiles, Fp8WideningGivesTheCodecsValueForEveryCode) {
  constexpr uint32_t kv = 256 + 32, rope = 16, tokens = 2, dim = kv + rope, tiles = 3;
  if (!cpu::FloatTilesUsable(dim, kv)) GTEST_SKIP() << "no AVX2 or AVX-512 on this CPU: the float tiles do not run";
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t token_bytes = EncodedBytes(Codec::kFp8, {1, kv, rope});
  ASSERT_EQ(token_bytes, kv + 4 * tiles + 2 * rope);
  std::vector<uint8_t> payload(tokens * token_bytes);
  float scale[tokens][tiles];
  for (uint32_t t = 0; t < tokens; ++t) {
    uint8_t* src = payload.data() + t * token_bytes;
    for (uint32_t c = 0; c < kv; ++c) src[c] = static_cast<uint8_t>(t == 0 ? c : 255 - c % 256);
    for (uint32_t i = 0; i < tiles; ++i) {
      scale[t][i] = std::fabs(normal(rng.engine())) + 0.01f;
      std::memcpy(src + kv + 4 * i, &scale[t][i], 4);
    }
    for (uint32_t c = 0; c < rope; ++c) {
      const uint16_t v = FloatToBf16(normal(rng.engine()));
      std::memcpy(src + kv + 4 * tiles + 2 * c, &v, 2);
    }
  }
  std::vector<float> rows(tokens * dim, -1.0f);
  cpu::WidenFp8Block(payload.data(), tokens, kv, rope, rows.data());
  for (uint32_t t = 0; t < tokens; ++t) {
    const uint8_t* src = payload.data() + t * token_bytes;
    for (uint32_t c = 0; c < dim; ++c) {
      float want;
      if (c < kv) {
        want = Fp8E4m3ToFloat(src[c]) * scale[t][c / kFp8TileSize];
      } else {
        uint16_t v;
        std::memcpy(&v, src + kv + 4 * tiles + 2 * (c - kv), 2);
        want = Bf16ToFloat(v);
      }
      const float got = rows[t * dim + c];
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << "token " << t << " channel " << c << " code " << int{src[c]};
      } else {
        ASSERT_EQ(got, want) << "token " << t << " channel " << c;
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::kernels
