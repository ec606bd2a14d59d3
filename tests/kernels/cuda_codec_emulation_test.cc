// The CUDA codec kernels that read 16 bytes at a time (int8, int4 and fp8
// quantize: their chunks, groups of tokens and loads ahead are where a
// layout change can go wrong) run on the CPU under tests/kernels/
// cuda_emulation.h, as codec.cu launches them, against the CPU codecs:
// the same bytes, every byte written, and the first value that is not
// finite named. The GPU runs the same kernels in kernels/cuda/
// check_codecs.cc (ctest label gpu), where their speed is measured too.
// clang-format off: first, as the cuda_runtime.h codec_kernels.cuh expects.
#include "tests/kernels/cuda_emulation.h"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "kernels/cuda/codec_kernels.cuh"
#include "kvtier/kernels/codec.h"
#include "tests/test_random.h"

namespace kvtier::kernels::cuda::codec_kernels {
namespace {

using ::kvtier::testing::cuda_emulation::Launch;

// Latents with one channel 30 times the others, as the GPU check draws them.
std::vector<float> RandomLatents(BlockShape shape, size_t blocks, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(shape.values() * blocks);
  for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (i % shape.dim() == 7 ? 30.0f : 1.0f);
  return x;
}

// The codec's 16-byte kernel, launched as cuda::Quantize launches it;
// returns the first value it found not finite (kNoBadValue when none).
unsigned long long RunQuantize(Codec codec, BlockShape shape, const std::vector<float>& x, size_t blocks,
                               std::vector<uint8_t>& out) {
  unsigned long long first_bad = kNoBadValue;
  LaunchShape at;
  switch (codec) {
    case Codec::kInt8:
      EXPECT_TRUE(Int8QuadsLaunch(shape, blocks, &at));
      Launch(at.grid, at.block, QuantizeInt8QuadsKernel, x.data(), out.data(), shape.tokens, shape.dim(),
             EncodedBytes(codec, shape), &first_bad);
      break;
    case Codec::kInt4:
      EXPECT_TRUE(Int4QuadsLaunch(shape, blocks, &at));
      Launch(at.grid, at.block, QuantizeInt4QuadsKernel, x.data(), out.data(), shape.tokens, shape.dim(),
             EncodedBytes(codec, shape), &first_bad);
      break;
    case Codec::kFp8: {
      const size_t tokens = size_t{shape.tokens} * blocks;
      at = Fp8WarpLaunch(tokens);
      Launch(at.grid, at.block, QuantizeFp8WarpKernel, x.data(), out.data(), tokens, shape.latent_dim, shape.rope_dim,
             EncodedBytes(codec, {1, shape.latent_dim, shape.rope_dim}), &first_bad);
      break;
    }
    default:
      ADD_FAILURE() << "no 16-byte quantize kernel for " << CodecName(codec);
  }
  return first_bad;
}

std::vector<uint8_t> CpuBytes(Codec codec, BlockShape shape, const std::vector<float>& x, size_t blocks) {
  const size_t bytes = EncodedBytes(codec, shape);
  std::vector<uint8_t> out(bytes * blocks);
  for (size_t b = 0; b < blocks; ++b) {
    const Status s = Quantize(codec, shape, std::span(x).subspan(b * shape.values(), shape.values()),
                              std::span(out).subspan(b * bytes, bytes));
    EXPECT_TRUE(s.ok()) << s.message();
  }
  return out;
}

// V2's and V3's blocks; a token count that leaves a group one token and a
// width that leaves chunks part empty; the most tokens the groups hold; a
// small block of two fp8 tiles.
constexpr BlockShape kShapes[] = {{64, 512, 64}, {33, 128, 8}, {128, 512, 64}, {7, 256, 16}};
constexpr Codec kWideCodecs[] = {Codec::kInt8, Codec::kInt4, Codec::kFp8};

TEST(CudaCodecEmulation, QuantizeKernelsWriteTheCpuCodecsBytes) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  for (Codec codec : kWideCodecs) {
    for (BlockShape shape : kShapes) {
      for (size_t blocks : {size_t{1}, size_t{3}}) {
        SCOPED_TRACE(std::string(CodecName(codec)) + " " + std::to_string(shape.tokens) + " x (" +
                     std::to_string(shape.latent_dim) + " + " + std::to_string(shape.rope_dim) + "), " +
                     std::to_string(blocks) + " blocks");
        const std::vector<float> x = RandomLatents(shape, blocks, rng.engine());
        std::vector<uint8_t> got(EncodedBytes(codec, shape) * blocks, 0xAB);  // every byte must be written
        EXPECT_EQ(RunQuantize(codec, shape, x, blocks, got), kNoBadValue);
        const std::vector<uint8_t> want = CpuBytes(codec, shape, x, blocks);
        size_t differing = 0, first = got.size();
        for (size_t i = 0; i < got.size(); ++i) {
          if (got[i] != want[i]) ++differing, first = std::min(first, i);
        }
        EXPECT_EQ(differing, 0u) << "first at byte " << first;
      }
    }
  }
}

// A NaN is named where it is; so is an infinity, except in int4, whose
// channel's range it makes infinite: that names the channel's byte column
// in its block's first token (the same bytes' low-nibble channel).
TEST(CudaCodecEmulation, QuantizeKernelsNameTheFirstValueThatIsNotFinite) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  for (Codec codec : kWideCodecs) {
    for (BlockShape shape : kShapes) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        SCOPED_TRACE(std::string(CodecName(codec)) + " " + std::to_string(shape.tokens) + " tokens, " +
                     std::to_string(bad));
        constexpr size_t kBlocks = 3;
        std::vector<float> x = RandomLatents(shape, kBlocks, rng.engine());
        const size_t at = std::uniform_int_distribution<size_t>(0, x.size() - 1)(rng.engine());
        x[at] = bad;
        size_t want = at;
        if (codec == Codec::kInt4 && std::isinf(bad)) {
          const size_t channel = at % shape.dim(), half = shape.dim() / 2;
          want = at / shape.values() * shape.values() + (channel < half ? channel : channel - half);
        }
        std::vector<uint8_t> out(EncodedBytes(codec, shape) * kBlocks);
        EXPECT_EQ(RunQuantize(codec, shape, x, kBlocks, out), want) << "at " << at;
      }
    }
  }
}

TEST(CudaCodecEmulation, BlocksBeyondTheGroupsGoToTheOneColumnKernels) {
  LaunchShape at;
  EXPECT_TRUE(Int8QuadsLaunch({128, 512, 64}, 1, &at));
  EXPECT_EQ(at.block.x, kChunkQuads * 16);
  EXPECT_FALSE(Int8QuadsLaunch({129, 512, 64}, 1, &at));
  EXPECT_FALSE(Int4QuadsLaunch({129, 512, 64}, 1, &at));
}

}  // namespace
}  // namespace kvtier::kernels::cuda::codec_kernels
