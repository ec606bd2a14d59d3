// int8 codec: symmetric, one bf16 scale per channel over the block's tokens.
// Layout: [dim] bf16 scales, then [tokens][dim] int8 codes.
#include <algorithm>
#include <cmath>
#include <vector>

#include "codec_internal.h"
#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels::cpu {

KVTIER_VECTOR_CLONES Status QuantizeInt8(BlockShape shape, const float* in, uint8_t* out) {
  if (Status s = CheckFinite(shape, in); !s.ok()) return s;
  const uint32_t dim = shape.dim();
  std::vector<float> amax(dim, 0.0f);
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    const float* row = in + size_t{t} * dim;
    for (uint32_t c = 0; c < dim; ++c) amax[c] = std::max(amax[c], std::fabs(row[c]));
  }
  std::vector<float>& inv = amax;  // reused: amax is not needed once scaled
  for (uint32_t c = 0; c < dim; ++c) {
    const uint16_t bits = FloatToBf16TowardPositive(std::max(amax[c] / 127.0f, kMinIntScale));
    StoreU16(out + 2 * c, bits);
    inv[c] = 1.0f / Bf16ToFloat(bits);
  }
  int8_t* codes = reinterpret_cast<int8_t*>(out + 2 * size_t{dim});
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    const float* row = in + size_t{t} * dim;
    int8_t* dst = codes + size_t{t} * dim;
    for (uint32_t c = 0; c < dim; ++c) {
      const float q = std::min(std::max(RoundHalfEven(row[c] * inv[c]), -127.0f), 127.0f);
      dst[c] = static_cast<int8_t>(q);
    }
  }
  return OkStatus();
}

KVTIER_VECTOR_CLONES void DequantizeInt8(BlockShape shape, const uint8_t* in, float* out) {
  const uint32_t dim = shape.dim();
  std::vector<float> scale(dim);
  for (uint32_t c = 0; c < dim; ++c) scale[c] = Bf16ToFloat(LoadU16(in + 2 * c));
  const int8_t* codes = reinterpret_cast<const int8_t*>(in + 2 * size_t{dim});
  for (uint32_t t = 0; t < shape.tokens; ++t) {
    const int8_t* src = codes + size_t{t} * dim;
    float* dst = out + size_t{t} * dim;
    for (uint32_t c = 0; c < dim; ++c) dst[c] = static_cast<float>(src[c]) * scale[c];
  }
}

}  // namespace kvtier::kernels::cpu
