// int4 codec: asymmetric, one bf16 scale and one bf16 zero point (the stored
// minimum) per channel over the block's tokens.
// Layout: [dim] bf16 scales, [dim] bf16 zeros, then per token ceil(dim/2)
// bytes; byte k holds channel k in its low nibble and channel k + ceil(dim/2)
// in its high nibble (zero padding when dim is odd), so packing and unpacking
// are contiguous vector operations on CPU and GPU alike.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "codec_internal.h"
#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels::cpu {

KVTIER_VECTOR_CLONES Status QuantizeInt4(BlockShape shape, const float* in, uint8_t* out) {
  const uint32_t dim = shape.dim();
  const uint32_t half = (dim + 1) / 2;
  if (Status s = CheckFinite(shape, in); !s.ok()) return s;
  std::vector<float> lo(in, in + dim), hi(in, in + dim);
  for (uint32_t t = 1; t < shape.tokens; ++t) {
    const float* row = in + size_t{t} * dim;
    for (uint32_t c = 0; c < dim; ++c) {
      lo[c] = std::min(lo[c], row[c]);
      hi[c] = std::max(hi[c], row[c]);
    }
  }
  std::vector<float>& zero = lo;  // reused once the minimum is stored
  std::vector<float>& inv = hi;
  for (uint32_t c = 0; c < dim; ++c) {
    const uint16_t zero_bits = FloatToBf16TowardNegative(lo[c]);
    const float z = Bf16ToFloat(zero_bits);
    const float range = hi[c] - z;
    const uint16_t scale_bits = FloatToBf16TowardPositive(std::max(range / 15.0f, kMinIntScale));
    const float s = Bf16ToFloat(scale_bits);
    if (!std::isfinite(z) || !std::isfinite(range) || !std::isfinite(s)) {
      return InvalidArgument("channel " + std::to_string(c) + " spans [" + std::to_string(lo[c]) + ", " +
                             std::to_string(hi[c]) + "], too wide for the int4 codec's bf16 scale");
    }
    StoreU16(out + 2 * c, scale_bits);
    StoreU16(out + 2 * (size_t{dim} + c), zero_bits);
    zero[c] = z;
    inv[c] = 1.0f / s;
  }
  uint8_t* codes = out + 4 * size_t{dim};
  std::vector<uint8_t> row_codes(2 * size_t{half}, 0);  // padding nibble stays 0
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    const float* row = in + size_t{t} * dim;
    for (uint32_t c = 0; c < dim; ++c) {
      const float q = RoundHalfEven((row[c] - zero[c]) * inv[c]);
      row_codes[c] = static_cast<uint8_t>(std::min(std::max(q, 0.0f), 15.0f));
    }
    uint8_t* dst = codes + size_t{t} * half;
    for (uint32_t k = 0; k < half; ++k) {
      dst[k] = static_cast<uint8_t>(row_codes[k] | (row_codes[half + k] << 4));
    }
  }
  return OkStatus();
}

KVTIER_VECTOR_CLONES void DequantizeInt4(BlockShape shape, const uint8_t* in, float* out) {
  const uint32_t dim = shape.dim();
  const uint32_t half = (dim + 1) / 2;
  const uint32_t high = dim - half;  // channels in the high nibbles
  std::vector<float> scale(dim), zero(dim);
  for (uint32_t c = 0; c < dim; ++c) {
    scale[c] = Bf16ToFloat(LoadU16(in + 2 * c));
    zero[c] = Bf16ToFloat(LoadU16(in + 2 * (size_t{dim} + c)));
  }
  const uint8_t* codes = in + 4 * size_t{dim};
  const float* scale_high = scale.data() + half;
  const float* zero_high = zero.data() + half;
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    const uint8_t* src = codes + size_t{t} * half;
    float* dst = out + size_t{t} * dim;
    float* dst_high = dst + half;
    for (uint32_t k = 0; k < half; ++k) {
      dst[k] = zero[k] + static_cast<float>(src[k] & 0xfu) * scale[k];
    }
    for (uint32_t k = 0; k < high; ++k) {
      dst_high[k] = zero_high[k] + static_cast<float>(src[k] >> 4u) * scale_high[k];
    }
  }
}

}  // namespace kvtier::kernels::cpu
