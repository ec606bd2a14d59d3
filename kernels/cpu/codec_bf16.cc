// bf16 codec: [tokens][dim] bf16, round to nearest even.
#include <string>

#include "codec_internal.h"
#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels::cpu {

KVTIER_VECTOR_CLONES Status QuantizeBf16(BlockShape shape, const float* in, uint8_t* out) {
  const size_t n = shape.values();
  uint16_t all_ones_exponent = 0;  // inf or NaN in the output, from any cause
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = FloatToBf16(in[i]);
    all_ones_exponent |= static_cast<uint16_t>((h & 0x7f80u) == 0x7f80u);
    StoreU16(out + 2 * i, h);
  }
  if (all_ones_exponent == 0) return OkStatus();
  if (Status s = CheckFinite(shape, in); !s.ok()) return s;
  for (size_t i = 0; i < n; ++i) {
    if ((FloatToBf16(in[i]) & 0x7f80u) == 0x7f80u) {
      return InvalidArgument("value " + std::to_string(in[i]) + " at token " + std::to_string(i / shape.dim()) +
                             ", channel " + std::to_string(i % shape.dim()) + " overflows bf16");
    }
  }
  return OkStatus();
}

KVTIER_VECTOR_CLONES void DequantizeBf16(BlockShape shape, const uint8_t* in, float* out) {
  const size_t n = shape.values();
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(LoadU16(in + 2 * i));
}

}  // namespace kvtier::kernels::cpu
