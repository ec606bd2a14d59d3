// fp8 codec: FlashMLA's FP8 token layout, per token
//   [latent_dim e4m3fn][ceil(latent_dim / 128) f32 scales][rope_dim bf16].
// The latent is rounded to bf16 first (FlashMLA quantizes bf16 caches), then
// each 128-wide tile is divided by a power-of-two scale covering its amax.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "codec_internal.h"
#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels::cpu {
namespace {

size_t Fp8TokenBytes(BlockShape shape, uint32_t tiles) {
  return shape.latent_dim + 4 * size_t{tiles} + 2 * size_t{shape.rope_dim};
}

Status OverflowError(uint32_t t, uint32_t c, float v) {
  return InvalidArgument("value " + std::to_string(v) + " at token " + std::to_string(t) + ", channel " +
                         std::to_string(c) + " overflows bf16");
}

// Bits of the largest |x| of a tile. Non-negative floats order like their
// bits, an integer max vectorizes where a float one would not, and inf and
// NaN (>= 0x7f800000) stay visible.
inline uint32_t AbsMaxBits(const float* in, uint32_t n) {
  uint32_t bits = 0;
  for (uint32_t c = 0; c < n; ++c) bits = std::max(bits, FloatBits(in[c]) & 0x7fffffffu);
  return bits;
}

// Rounds finite input to bf16 (FlashMLA quantizes bf16 caches), scales, and
// converts; |bf16(x) * inv| <= 448 since the scale covers the tile's amax.
inline void EncodeTile(const float* __restrict in, float inv, uint8_t* __restrict codes, uint32_t n) {
  for (uint32_t c = 0; c < n; ++c) {
    codes[c] = Fp8E4m3FromInRange(BitsToFloat(RoundToBf16Bits(FloatBits(in[c])) << 16) * inv);
  }
}

}  // namespace

KVTIER_VECTOR_CLONES Status QuantizeFp8(BlockShape shape, const float* in, uint8_t* out) {
  const uint32_t dim = shape.dim();
  const uint32_t tiles = (shape.latent_dim + kFp8TileSize - 1) / kFp8TileSize;
  const size_t token_bytes = Fp8TokenBytes(shape, tiles);
  // Pass 1 streams through the block once for every tile's amax (and the
  // finiteness check); pass 2 then finds the block in cache. Measured faster
  // than one pass per token, which stalls on each row's first touch.
  std::vector<uint32_t> amax_bits(size_t{shape.tokens} * tiles);
  uint32_t any_bits = 0;
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    const float* row = in + size_t{t} * dim;
    for (uint32_t tile = 0; tile < tiles; ++tile) {
      const uint32_t begin = tile * kFp8TileSize;
      const uint32_t n = std::min(begin + kFp8TileSize, shape.latent_dim) - begin;
      // Full tiles take a constant trip count, which the compiler unrolls.
      const uint32_t bits = n == kFp8TileSize ? AbsMaxBits(row + begin, kFp8TileSize) : AbsMaxBits(row + begin, n);
      amax_bits[size_t{t} * tiles + tile] = bits;
      any_bits = std::max(any_bits, bits);
    }
    any_bits = std::max(any_bits, AbsMaxBits(row + shape.latent_dim, shape.rope_dim));
  }
  if (any_bits >= 0x7f800000u) return CheckFinite(shape, in);

  std::vector<uint16_t> rope(shape.rope_dim);
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    const float* row = in + size_t{t} * dim;
    uint8_t* dst = out + t * token_bytes;
    uint8_t* scales = dst + shape.latent_dim;
    for (uint32_t tile = 0; tile < tiles; ++tile) {
      const uint32_t begin = tile * kFp8TileSize;
      const uint32_t n = std::min(begin + kFp8TileSize, shape.latent_dim) - begin;
      // Rounding is monotonic: the largest rounded magnitude is the rounded
      // largest magnitude.
      const float amax = Bf16ToFloat(FloatToBf16(BitsToFloat(amax_bits[size_t{t} * tiles + tile])));
      if (std::isinf(amax)) {
        for (uint32_t c = begin; c < begin + n; ++c) {
          if (std::isinf(Bf16ToFloat(FloatToBf16(row[c])))) return OverflowError(t, c, row[c]);
        }
      }
      const float scale = Fp8TileScale(amax);
      const float inv = 1.0f / scale;  // exact: scale is a power of two
      std::memcpy(scales + 4 * size_t{tile}, &scale, sizeof scale);
      if (n == kFp8TileSize) {
        EncodeTile(row + begin, inv, dst + begin, kFp8TileSize);
      } else {
        EncodeTile(row + begin, inv, dst + begin, n);
      }
    }
    uint32_t rope_overflow = 0;
    for (uint32_t c = 0; c < shape.rope_dim; ++c) {
      rope[c] = FloatToBf16(row[shape.latent_dim + c]);
      rope_overflow |= static_cast<uint32_t>((rope[c] & 0x7f80u) == 0x7f80u);
    }
    if (rope_overflow != 0) {
      for (uint32_t c = 0; c < shape.rope_dim; ++c) {
        if ((rope[c] & 0x7f80u) == 0x7f80u) {
          return OverflowError(t, shape.latent_dim + c, row[shape.latent_dim + c]);
        }
      }
    }
    if (!rope.empty()) std::memcpy(scales + 4 * size_t{tiles}, rope.data(), 2 * rope.size());
  }
  return OkStatus();
}

KVTIER_VECTOR_CLONES void DequantizeFp8(BlockShape shape, const uint8_t* in, float* out) {
  const uint32_t dim = shape.dim();
  const uint32_t tiles = (shape.latent_dim + kFp8TileSize - 1) / kFp8TileSize;
  const size_t token_bytes = Fp8TokenBytes(shape, tiles);
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    const uint8_t* src = in + t * token_bytes;
    const uint8_t* scales = src + shape.latent_dim;
    const uint8_t* rope = scales + 4 * size_t{tiles};
    float* dst = out + size_t{t} * dim;
    for (uint32_t tile = 0; tile < tiles; ++tile) {
      float scale;
      std::memcpy(&scale, scales + 4 * size_t{tile}, sizeof scale);
      const uint32_t begin = tile * kFp8TileSize;
      const uint32_t end = std::min(begin + kFp8TileSize, shape.latent_dim);
      for (uint32_t c = begin; c < end; ++c) dst[c] = Fp8E4m3ToFloat(src[c]) * scale;
    }
    for (uint32_t c = 0; c < shape.rope_dim; ++c) {
      dst[shape.latent_dim + c] = Bf16ToFloat(LoadU16(rope + 2 * size_t{c}));
    }
  }
}

}  // namespace kvtier::kernels::cpu
