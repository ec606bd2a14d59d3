// Every codec against float64 references: error bounds per element, the
// documented byte layouts, FlashMLA byte compatibility, and bad input.
#include "kvtier/kernels/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kvtier/kernels/float_formats.h"
#include "tests/test_random.h"

namespace kvtier::kernels {
namespace {

std::vector<uint8_t> Encode(Codec codec, BlockShape shape, const std::vector<float>& in) {
  std::vector<uint8_t> out(EncodedBytes(codec, shape), 0xAB);
  Status s = Quantize(codec, shape, in, out);
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

std::vector<float> Decode(Codec codec, BlockShape shape, const std::vector<uint8_t>& in) {
  std::vector<float> out(shape.values(), std::numeric_limits<float>::quiet_NaN());
  Status s = Dequantize(codec, shape, in, out);
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

// Random latents with per-channel scale and offset, some outlier channels,
// a constant channel and an all-zero channel.
std::vector<float> RandomLatents(BlockShape shape, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<double> scale(shape.dim()), offset(shape.dim());
  for (uint32_t c = 0; c < shape.dim(); ++c) {
    scale[c] = std::exp(normal(rng)) * (uniform(rng) < 0.05 ? 50.0 : 1.0);
    offset[c] = normal(rng) * scale[c];
  }
  std::vector<float> x(shape.values());
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    for (uint32_t c = 0; c < shape.dim(); ++c) {
      x[size_t{t} * shape.dim() + c] = static_cast<float>(offset[c] + scale[c] * normal(rng));
    }
  }
  if (shape.dim() >= 3) {
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      x[size_t{t} * shape.dim() + 1] = 2.75f;  // constant, exact in bf16
      x[size_t{t} * shape.dim() + 2] = 0.0f;
    }
  }
  return x;
}

// Per-channel extremes over the block's tokens, in double.
struct ChannelRange {
  double lo = INFINITY, hi = -INFINITY, amax = 0;
};
std::vector<ChannelRange> Ranges(BlockShape shape, const std::vector<float>& x) {
  std::vector<ChannelRange> r(shape.dim());
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    for (uint32_t c = 0; c < shape.dim(); ++c) {
      const double v = x[size_t{t} * shape.dim() + c];
      r[c].lo = std::min(r[c].lo, v);
      r[c].hi = std::max(r[c].hi, v);
      r[c].amax = std::max(r[c].amax, std::fabs(v));
    }
  }
  return r;
}

// Largest error each element may have: half its quantization step, from the
// step a float64 implementation of the codec's definition gives, widened by
// the bf16 rounding of stored scales (2^-7) and float32 arithmetic.
std::vector<double> ErrorBounds(Codec codec, BlockShape shape, const std::vector<float>& x) {
  const auto ranges = Ranges(shape, x);
  std::vector<double> bound(shape.values());
  constexpr double kBf16Rel = 0x1p-8;  // half-ulp of bf16, relative
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    for (uint32_t c = 0; c < shape.dim(); ++c) {
      const size_t i = size_t{t} * shape.dim() + c;
      const double v = std::fabs(x[i]);
      const ChannelRange& r = ranges[c];
      double b = 0;
      switch (codec) {
        case Codec::kBf16:
          b = v * kBf16Rel;
          break;
        case Codec::kInt8:
          b = r.amax / 127.0 * (1 + 0x1p-7) / 2;
          break;
        case Codec::kInt4: {
          const double zero_slack = std::fabs(r.lo) * 0x1p-7;  // zero rounded down to bf16
          b = (r.hi - r.lo + zero_slack) / 15.0 * (1 + 0x1p-7) / 2;
          break;
        }
        case Codec::kFp8:
          if (c >= shape.latent_dim) {
            b = v * kBf16Rel;
          } else {
            const uint32_t tile_begin = c / kFp8TileSize * kFp8TileSize;
            const uint32_t tile_end = std::min(tile_begin + kFp8TileSize, shape.latent_dim);
            double amax = 0;
            for (uint32_t k = tile_begin; k < tile_end; ++k) {
              amax = std::max(amax, std::fabs(double{x[size_t{t} * shape.dim() + k]}));
            }
            const double scale = std::exp2(std::ceil(std::log2(std::max(amax * (1 + kBf16Rel) / 448.0, 1e-4))));
            // bf16 rounding of the input, then e4m3: 3 mantissa bits
            // (relative half-step 2^-4) or the subnormal half-step 2^-10.
            b = v * kBf16Rel + std::max(v * (1 + kBf16Rel) * 0x1p-4, 0x1p-10 * scale);
          }
          break;
      }
      bound[i] = b * (1 + 1e-6) + v * 1e-7 + 1e-30;
    }
  }
  return bound;
}

const BlockShape kShapes[] = {
    {64, 512, 64},  // DeepSeek-V2(-Lite) at the default block size
    {1, 512, 64},   // single-token block
    {17, 130, 3},   // odd sizes, fp8 partial tile
    {5, 7, 0},      // no rope dims, odd channel count (int4 padding nibble)
    {3, 1, 1},     {128, 256, 32},
};

class CodecTest : public ::testing::TestWithParam<Codec> {};

TEST_P(CodecTest, EveryElementWithinHalfItsStep) {
  const Codec codec = GetParam();
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  for (const BlockShape& shape : kShapes) {
    SCOPED_TRACE(::testing::Message() << shape.tokens << "x(" << shape.latent_dim << "+" << shape.rope_dim << ")");
    const std::vector<float> x = RandomLatents(shape, rng.engine());
    const std::vector<float> y = Decode(codec, shape, Encode(codec, shape, x));
    const std::vector<double> bound = ErrorBounds(codec, shape, x);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_LE(std::fabs(double{x[i]} - y[i]), bound[i])
          << "token " << i / shape.dim() << " channel " << i % shape.dim() << ": " << x[i] << " -> " << y[i];
    }
  }
}

// Some tokens of a block decoded alone (what sparse attention reads of a
// block) are their rows of the whole block, bit for bit, for every shape:
// each token alone, and a random subset in a random order.
TEST_P(CodecTest, TokensAloneDecodeAsTheirRowsOfTheBlock) {
  const Codec codec = GetParam();
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  for (const BlockShape& shape : kShapes) {
    SCOPED_TRACE(::testing::Message() << shape.tokens << "x(" << shape.latent_dim << "+" << shape.rope_dim << ")");
    const std::vector<uint8_t> block = Encode(codec, shape, RandomLatents(shape, rng.engine()));
    const std::vector<float> all = Decode(codec, shape, block);
    std::vector<float> one(shape.dim());
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      ASSERT_TRUE(DequantizeTokens(codec, shape, block, std::span(&t, 1), one).ok());
      ASSERT_TRUE(std::equal(one.begin(), one.end(), all.begin() + size_t{t} * shape.dim())) << "token " << t;
    }
    std::vector<uint32_t> some(shape.tokens);
    std::iota(some.begin(), some.end(), 0u);
    std::shuffle(some.begin(), some.end(), rng.engine());
    some.resize((shape.tokens + 1) / 2);
    std::vector<float> rows(some.size() * shape.dim());
    ASSERT_TRUE(DequantizeTokens(codec, shape, block, some, rows).ok());
    for (size_t i = 0; i < some.size(); ++i) {
      ASSERT_TRUE(std::equal(rows.begin() + i * shape.dim(), rows.begin() + (i + 1) * shape.dim(),
                             all.begin() + size_t{some[i]} * shape.dim()))
          << "token " << some[i];
    }
    const uint32_t past = shape.tokens;
    EXPECT_EQ(DequantizeTokens(codec, shape, block, std::span(&past, 1), one).code(), StatusCode::kInvalidArgument);
  }
}

TEST_P(CodecTest, ZerosRoundTripExactly) {
  const Codec codec = GetParam();
  for (const BlockShape& shape : kShapes) {
    const std::vector<float> x(shape.values(), 0.0f);
    const std::vector<float> y = Decode(codec, shape, Encode(codec, shape, x));
    for (float v : y) ASSERT_EQ(v, 0.0f);
  }
}

TEST_P(CodecTest, RejectsNonFiniteInputNamingThePlace) {
  const Codec codec = GetParam();
  const BlockShape shape{4, 8, 2};
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}) {
    std::vector<float> x(shape.values(), 1.0f);
    x[2 * shape.dim() + 9] = bad;  // token 2, channel 9 (a rope channel)
    std::vector<uint8_t> out(EncodedBytes(codec, shape));
    Status s = Quantize(codec, shape, x, out);
    ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("token 2, channel 9"), std::string::npos) << s.message();
  }
}

TEST_P(CodecTest, RejectsWrongSizesAndShapes) {
  const Codec codec = GetParam();
  const BlockShape shape{4, 8, 2};
  std::vector<float> x(shape.values(), 1.0f);
  std::vector<uint8_t> out(EncodedBytes(codec, shape));
  std::vector<uint8_t> short_out(out.size() - 1);
  EXPECT_EQ(Quantize(codec, shape, x, short_out).code(), StatusCode::kInvalidArgument);
  std::vector<float> short_in(x.size() - 1);
  EXPECT_EQ(Quantize(codec, shape, short_in, out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Dequantize(codec, shape, short_out, x).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Dequantize(codec, shape, out, short_in).code(), StatusCode::kInvalidArgument);
  for (BlockShape bad : {BlockShape{0, 8, 2}, BlockShape{kMaxBlockTokens + 1, 8, 2}, BlockShape{4, 0, 2},
                         BlockShape{4, kMaxLatentDim + 1, 0}}) {
    EXPECT_EQ(EncodedBytes(codec, bad), 0u);
    EXPECT_EQ(Quantize(codec, bad, x, out).code(), StatusCode::kInvalidArgument);
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecTest, ::testing::ValuesIn(kAllCodecs),
                         [](const auto& info) { return std::string(CodecName(info.param)); });

TEST(CodecSizes, MeetTheTargetsAtV2LiteDims) {
  const BlockShape v2lite{64, 512, 64};
  EXPECT_EQ(EncodedBytes(Codec::kBf16, v2lite), 1152u * 64);
  EXPECT_EQ(EncodedBytes(Codec::kFp8, v2lite), 656u * 64);
  EXPECT_EQ(EncodedBytes(Codec::kInt8, v2lite), 594u * 64);  // target <= 600
  EXPECT_EQ(EncodedBytes(Codec::kInt4, v2lite), 324u * 64);  // target <= 330
}

TEST(CodecNames, RoundTrip) {
  for (Codec c : kAllCodecs) EXPECT_EQ(ParseCodec(CodecName(c)), c);
  EXPECT_FALSE(ParseCodec("int2").has_value());
}

TEST(Bf16Codec, LosslessForBf16Input) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const BlockShape shape{9, 40, 8};
  std::vector<float> x = RandomLatents(shape, rng.engine());
  for (float& v : x) v = Bf16ToFloat(FloatToBf16(v));
  EXPECT_EQ(Decode(Codec::kBf16, shape, Encode(Codec::kBf16, shape, x)), x);
}

TEST(Bf16Codec, RejectsValuesBeyondBf16Range) {
  const BlockShape shape{1, 2, 0};
  std::vector<float> x = {1.0f, std::numeric_limits<float>::max()};
  std::vector<uint8_t> out(EncodedBytes(Codec::kBf16, shape));
  Status s = Quantize(Codec::kBf16, shape, x, out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overflows bf16"), std::string::npos) << s.message();
}

TEST(Int4Codec, RejectsRangesTooWideForItsScale) {
  const BlockShape shape{2, 1, 0};
  std::vector<float> x = {-3e38f, 3e38f};
  std::vector<uint8_t> out(EncodedBytes(Codec::kInt4, shape));
  EXPECT_EQ(Quantize(Codec::kInt4, shape, x, out).code(), StatusCode::kInvalidArgument);
}

TEST(Int4Codec, ConstantChannelsAreExact) {
  const BlockShape shape{16, 6, 0};
  std::vector<float> x(shape.values());
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 6) * -1.25f + 0.5f;
  EXPECT_EQ(Decode(Codec::kInt4, shape, Encode(Codec::kInt4, shape, x)), x);
}

uint16_t LoadU16(const std::vector<uint8_t>& b, size_t at) {
  uint16_t v;
  std::memcpy(&v, b.data() + at, 2);
  return v;
}

// The absorbed attention kernels read codes in place, so the layout in
// codec.h is a contract: decode it by hand from the documented offsets.
TEST(CodecLayout, Int8MatchesTheDocumentedLayout) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const BlockShape shape{7, 10, 3};
  const std::vector<float> x = RandomLatents(shape, rng.engine());
  const std::vector<uint8_t> b = Encode(Codec::kInt8, shape, x);
  const std::vector<float> y = Decode(Codec::kInt8, shape, b);
  const auto ranges = Ranges(shape, x);
  for (uint32_t c = 0; c < shape.dim(); ++c) {
    const float scale = Bf16ToFloat(LoadU16(b, 2 * c));
    EXPECT_GE(double{scale} * 127, ranges[c].amax) << "scale must cover channel " << c;
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      const int8_t code = static_cast<int8_t>(b[2 * shape.dim() + t * shape.dim() + c]);
      EXPECT_EQ(y[t * shape.dim() + c], code * scale);
    }
  }
}

// Values x whose quantized position (x - zero) * inv rounds, in float, to
// exactly k + 0.5 while the exact product lies off the tie: the codes then
// depend on whether the product is rounded before the rounding to an
// integer. The codecs round it (no FMA): every node, CPU clone and GPU
// kernel must store the same bytes for the same latents.
std::vector<float> NearTies(float zero, float inv, int first_k, int last_k) {
  std::vector<float> out;
  for (int k = first_k; k <= last_k; ++k) {
    float x = zero + (static_cast<float>(k) + 0.5f) / inv;
    for (int step = 0; step < 8; ++step, x = std::nextafter(x, INFINITY)) {
      volatile float shifted = x - zero;
      volatile float product = shifted * inv;
      if (product == static_cast<float>(k) + 0.5f && double{shifted} * inv != k + 0.5) {
        out.push_back(x);
        break;
      }
    }
  }
  return out;
}

// The code the documented rule gives: the product rounded to float, then
// to the nearest integer with ties to even, then clamped.
int DocumentedCode(float x, float zero, float inv, int lo, int hi) {
  volatile float shifted = x - zero;
  volatile float product = shifted * inv;
  return std::clamp(static_cast<int>(std::nearbyint(product)), lo, hi);
}

TEST(CodecRounding, IntegerCodesRoundTheProductFirstBitForBit) {
  // int8, one channel: token 0 sets the scale, the others sit on near ties.
  const BlockShape one{1, 1, 0};
  std::vector<uint8_t> first = Encode(Codec::kInt8, one, {120.0f});
  const float scale8 = Bf16ToFloat(LoadU16(first, 0)), inv8 = 1.0f / scale8;
  std::vector<float> x = {120.0f};
  for (float v : NearTies(0.0f, inv8, 1, 100)) x.push_back(v), x.push_back(-v);
  ASSERT_GT(x.size(), 20u) << "too few near ties found to test with";
  const BlockShape shape8{static_cast<uint32_t>(x.size()), 1, 0};
  const std::vector<uint8_t> b8 = Encode(Codec::kInt8, shape8, x);
  ASSERT_EQ(Bf16ToFloat(LoadU16(b8, 0)), scale8);
  for (size_t t = 0; t < x.size(); ++t) {
    EXPECT_EQ(static_cast<int8_t>(b8[2 + t]), DocumentedCode(x[t], 0.0f, inv8, -127, 127)) << "x = " << x[t];
  }
  // int4: the channel's minimum is the zero point, 15 steps above it the
  // maximum.
  std::vector<uint8_t> probe = Encode(Codec::kInt4, {2, 1, 0}, {-3.0f, 9.0f});
  const float zero = Bf16ToFloat(LoadU16(probe, 2)), scale4 = Bf16ToFloat(LoadU16(probe, 0)), inv4 = 1.0f / scale4;
  std::vector<float> y = {-3.0f, 9.0f};
  for (float v : NearTies(zero, inv4, 0, 13)) y.push_back(v);
  ASSERT_GT(y.size(), 6u);
  const BlockShape shape4{static_cast<uint32_t>(y.size()), 1, 0};
  const std::vector<uint8_t> b4 = Encode(Codec::kInt4, shape4, y);
  ASSERT_EQ(Bf16ToFloat(LoadU16(b4, 2)), zero);
  ASSERT_EQ(Bf16ToFloat(LoadU16(b4, 0)), scale4);
  for (size_t t = 0; t < y.size(); ++t) {
    EXPECT_EQ(b4[4 + t] & 0xf, DocumentedCode(y[t], zero, inv4, 0, 15)) << "y = " << y[t];
  }
}

TEST(CodecLayout, Int4MatchesTheDocumentedLayout) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const BlockShape shape{5, 8, 3};  // 11 channels: last byte has a padding nibble
  const std::vector<float> x = RandomLatents(shape, rng.engine());
  const std::vector<uint8_t> b = Encode(Codec::kInt4, shape, x);
  const std::vector<float> y = Decode(Codec::kInt4, shape, b);
  const uint32_t dim = shape.dim(), row_bytes = (dim + 1) / 2;
  const auto ranges = Ranges(shape, x);
  for (uint32_t c = 0; c < dim; ++c) {
    const float scale = Bf16ToFloat(LoadU16(b, 2 * c));
    const float zero = Bf16ToFloat(LoadU16(b, 2 * (dim + c)));
    EXPECT_LE(zero, ranges[c].lo);
    EXPECT_GE(double{zero} + 15.0 * scale, ranges[c].hi);
    for (uint32_t t = 0; t < shape.tokens; ++t) {
      // Channel c < ceil(dim/2) in the low nibble of byte c, the rest in the
      // high nibble of byte c - ceil(dim/2).
      const bool low = c < row_bytes;
      const uint8_t byte = b[4 * dim + t * row_bytes + (low ? c : c - row_bytes)];
      const int code = low ? byte & 0xf : byte >> 4;
      EXPECT_EQ(y[t * dim + c], zero + code * scale);
    }
  }
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    EXPECT_EQ(b[4 * dim + t * row_bytes + row_bytes - 1] >> 4, 0) << "padding nibble";
  }
}

// FlashMLA's V32 FP8 quantizer, written from its definition in float64:
// per 128-channel tile, scale = 2^ceil(log2(max(amax / 448, 1e-4))) over the
// bf16 latent, code = e4m3(x / scale); layout [512 e4m3][4 f32][64 bf16].
std::vector<uint8_t> FlashMlaFp8Reference(const std::vector<float>& x, uint32_t tokens) {
  std::vector<uint8_t> out(tokens * 656);
  for (uint32_t t = 0; t < tokens; ++t) {
    uint8_t* dst = out.data() + t * 656;
    for (int tile = 0; tile < 4; ++tile) {
      double amax = 0;
      for (int c = tile * 128; c < tile * 128 + 128; ++c) {
        amax = std::max(amax, std::fabs(double{Bf16ToFloat(FloatToBf16(x[t * 576 + c]))}));
      }
      const float inv = static_cast<float>(amax) / 448.0f;
      const float scale = static_cast<float>(std::exp2(std::ceil(std::log2(std::max(double{inv}, double{1e-4f})))));
      std::memcpy(dst + 512 + 4 * tile, &scale, 4);
      for (int c = tile * 128; c < tile * 128 + 128; ++c) {
        const double v = Bf16ToFloat(FloatToBf16(x[t * 576 + c])) / double{scale};
        // Nearest e4m3 code by search over all codes, ties to even.
        int best = 0;
        double best_err = INFINITY;
        for (int code = 0; code < 256; ++code) {
          const float f = Fp8E4m3ToFloat(static_cast<uint8_t>(code));
          if (std::isnan(f) || std::signbit(f) != std::signbit(v)) continue;
          const double err = std::fabs(f - v);
          if (err < best_err || (err == best_err && (code & 1) == 0)) best = code, best_err = err;
        }
        dst[c] = static_cast<uint8_t>(best);
      }
    }
    for (int c = 0; c < 64; ++c) {
      const uint16_t h = FloatToBf16(x[t * 576 + 512 + c]);
      std::memcpy(dst + 528 + 2 * c, &h, 2);
    }
  }
  return out;
}

TEST(Fp8Codec, ByteForByteFlashMlaLayout) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const BlockShape shape{64, 512, 64};
  std::vector<float> x = RandomLatents(shape, rng.engine());
  for (int c = 0; c < 128; ++c) x[c] *= 1e-6f;  // token 0, tile 0: below the 1e-4 scale floor
  EXPECT_EQ(Encode(Codec::kFp8, shape, x), FlashMlaFp8Reference(x, shape.tokens));
}

}  // namespace
}  // namespace kvtier::kernels
