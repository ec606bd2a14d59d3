// int4 codec: asymmetric, one bf16 scale and one bf16 zero point (the stored
// minimum) per channel over the block's tokens.
// Layout: [dim] bf16 scales, [dim] bf16 zeros, [tokens][ceil(dim/2)] nibbles.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "codec_internal.h"
#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels::cpu {

Status QuantizeInt4(BlockShape shape, const float* in, uint8_t* out) {
  if (Status s = CheckFinite(shape, in); !s.ok()) return s;
  const uint32_t dim = shape.dim();
  const size_t row_bytes = (dim + 1) / 2;
  std::vector<float> lo(in, in + dim), hi(in, in + dim);
  for (uint32_t t = 1; t < shape.tokens; ++t) {
    const float* row = in + size_t{t} * dim;
    for (uint32_t c = 0; c < dim; ++c) {
      lo[c] = std::min(lo[c], row[c]);
      hi[c] = std::max(hi[c], row[c]);
    }
  }
  // Padded to even so the packing loop can read channel 2k+1 unconditionally.
  std::vector<float> zero(dim + 1, 0.0f), inv(dim + 1, 0.0f);
  for (uint32_t c = 0; c < dim; ++c) {
    const uint16_t zero_bits = FloatToBf16TowardNegative(lo[c]);
    const float z = Bf16ToFloat(zero_bits);
    const float range = hi[c] - z;
    const uint16_t scale_bits =
        FloatToBf16TowardPositive(std::max(range / 15.0f, kMinIntScale));
    const float s = Bf16ToFloat(scale_bits);
    if (!std::isfinite(z) || !std::isfinite(range) || !std::isfinite(s)) {
      return InvalidArgument("channel " + std::to_string(c) + " spans [" +
                             std::to_string(lo[c]) + ", " + std::to_string(hi[c]) +
                             "], too wide for the int4 codec's bf16 scale");
    }
    StoreU16(out + 2 * c, scale_bits);
    StoreU16(out + 2 * (size_t{dim} + c), zero_bits);
    zero[c] = z;
    inv[c] = 1.0f / s;
  }
  uint8_t* codes = out + 4 * size_t{dim};
  std::vector<float> padded(dim + 1, 0.0f);
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    std::copy_n(in + size_t{t} * dim, dim, padded.begin());
    uint8_t* dst = codes + t * row_bytes;
    for (size_t k = 0; k < row_bytes; ++k) {
      const float q0 = std::clamp(RoundHalfEven((padded[2 * k] - zero[2 * k]) * inv[2 * k]), 0.0f, 15.0f);
      const float q1 = std::clamp(RoundHalfEven((padded[2 * k + 1] - zero[2 * k + 1]) * inv[2 * k + 1]), 0.0f, 15.0f);
      dst[k] = static_cast<uint8_t>(static_cast<uint32_t>(q0) | (static_cast<uint32_t>(q1) << 4));
    }
  }
  return OkStatus();
}

void DequantizeInt4(BlockShape shape, const uint8_t* in, float* out) {
  const uint32_t dim = shape.dim();
  const size_t row_bytes = (dim + 1) / 2;
  std::vector<float> scale(2 * row_bytes, 0.0f), zero(2 * row_bytes, 0.0f);
  for (uint32_t c = 0; c < dim; ++c) {
    scale[c] = Bf16ToFloat(LoadU16(in + 2 * c));
    zero[c] = Bf16ToFloat(LoadU16(in + 2 * (size_t{dim} + c)));
  }
  const uint8_t* codes = in + 4 * size_t{dim};
  std::vector<float> row(2 * row_bytes);
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    const uint8_t* src = codes + t * row_bytes;
    for (size_t k = 0; k < row_bytes; ++k) {
      row[2 * k] = zero[2 * k] + static_cast<float>(src[k] & 0xf) * scale[2 * k];
      row[2 * k + 1] = zero[2 * k + 1] + static_cast<float>(src[k] >> 4) * scale[2 * k + 1];
    }
    std::copy_n(row.begin(), dim, out + size_t{t} * dim);
  }
}

}  // namespace kvtier::kernels::cpu
