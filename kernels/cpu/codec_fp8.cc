// fp8 codec: FlashMLA's FP8 token layout, per token
//   [latent_dim e4m3fn][ceil(latent_dim / 128) f32 scales][rope_dim bf16].
// The latent is rounded to bf16 first (FlashMLA quantizes bf16 caches), then
// each 128-wide tile is divided by a power-of-two scale covering its amax.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "codec_internal.h"
#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels::cpu {
namespace {

// 2^ceil(log2(max(amax / 448, 1e-4))), computed exactly on the float's bits.
float Fp8TileScale(float amax) {
  const float v = std::max(amax / kFp8E4m3Max, 1e-4f);
  uint32_t u = FloatBits(v);
  if ((u & 0x7fffffu) != 0) u = (u & 0x7f800000u) + 0x800000u;
  return BitsToFloat(u);
}

size_t Fp8TokenBytes(BlockShape shape, uint32_t tiles) {
  return shape.latent_dim + 4 * size_t{tiles} + 2 * size_t{shape.rope_dim};
}

Status OverflowError(uint32_t t, uint32_t c, float v) {
  return InvalidArgument("value " + std::to_string(v) + " at token " + std::to_string(t) +
                         ", channel " + std::to_string(c) + " overflows bf16");
}

}  // namespace

Status QuantizeFp8(BlockShape shape, const float* in, uint8_t* out) {
  if (Status s = CheckFinite(shape, in); !s.ok()) return s;
  const uint32_t dim = shape.dim();
  const uint32_t tiles = (shape.latent_dim + kFp8TileSize - 1) / kFp8TileSize;
  const size_t token_bytes = Fp8TokenBytes(shape, tiles);
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    const float* row = in + size_t{t} * dim;
    uint8_t* dst = out + t * token_bytes;
    uint8_t* scales = dst + shape.latent_dim;
    uint8_t* rope = scales + 4 * size_t{tiles};
    for (uint32_t tile = 0; tile < tiles; ++tile) {
      const uint32_t begin = tile * kFp8TileSize;
      const uint32_t end = std::min(begin + kFp8TileSize, shape.latent_dim);
      float rounded[kFp8TileSize];
      float amax = 0.0f;
      for (uint32_t c = begin; c < end; ++c) {
        const float r = Bf16ToFloat(FloatToBf16(row[c]));
        if (std::isinf(r)) return OverflowError(t, c, row[c]);
        rounded[c - begin] = r;
        amax = std::max(amax, std::fabs(r));
      }
      const float scale = Fp8TileScale(amax);
      const float inv = 1.0f / scale;  // exact: scale is a power of two
      std::memcpy(scales + 4 * size_t{tile}, &scale, sizeof scale);
      for (uint32_t c = begin; c < end; ++c) dst[c] = FloatToFp8E4m3(rounded[c - begin] * inv);
    }
    for (uint32_t c = 0; c < shape.rope_dim; ++c) {
      const uint16_t h = FloatToBf16(row[shape.latent_dim + c]);
      if ((h & 0x7f80u) == 0x7f80u) {
        return OverflowError(t, shape.latent_dim + c, row[shape.latent_dim + c]);
      }
      StoreU16(rope + 2 * size_t{c}, h);
    }
  }
  return OkStatus();
}

void DequantizeFp8(BlockShape shape, const uint8_t* in, float* out) {
  const uint32_t dim = shape.dim();
  const uint32_t tiles = (shape.latent_dim + kFp8TileSize - 1) / kFp8TileSize;
  const size_t token_bytes = Fp8TokenBytes(shape, tiles);
  static const auto kTable = [] {
    struct Table { float v[256]; } table;
    for (int i = 0; i < 256; ++i) table.v[i] = Fp8E4m3ToFloat(static_cast<uint8_t>(i));
    return table;
  }();
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
      for (uint32_t c = begin; c < end; ++c) dst[c] = kTable.v[src[c]] * scale;
    }
    for (uint32_t c = 0; c < shape.rope_dim; ++c) {
      dst[shape.latent_dim + c] = Bf16ToFloat(LoadU16(rope + 2 * size_t{c}));
    }
  }
}

}  // namespace kvtier::kernels::cpu
