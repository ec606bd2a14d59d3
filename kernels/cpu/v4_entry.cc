#include "kvtier/kernels/v4_entry.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/qat_rounding.h"

namespace kvtier::kernels {
namespace {

constexpr size_t kFp8Block = 64, kFp4Block = 32;

// The exponent k of the smallest 2^k with amax <= limit * 2^k (k in
// [-127, 127], the E8M0 range); amax 0 gives 0.
int ScaleExponent(float amax, float limit) {
  if (amax == 0.0f) return 0;
  // A small amax is scaled up by 2^64 first, so that the ratio is a normal
  // float (PowerOfTwoAtLeast's domain) even under a scale near 2^-127.
  const int shift = amax < 1.0f ? 64 : 0;
  int k = std::ilogb(PowerOfTwoAtLeast(std::ldexp(amax, shift) / limit)) - shift;
  if (k < 127 && amax > std::ldexp(limit, k)) ++k;  // the division rounded down to a power of two
  return k < -127 ? -127 : k;
}

Status Lossy(const std::string& what) {
  return InvalidArgument("V4 entry: " + what + " cannot be stored without loss");
}

}  // namespace

size_t V4EntryBytes(size_t dim, size_t rope_dim) {
  const size_t fp8 = dim - rope_dim;
  return fp8 + fp8 / kFp8Block + 2 * rope_dim + 1;
}

size_t V4IndexKeyBytes(size_t dim) { return dim / 2 + dim / kFp4Block; }

size_t V4BlockBytes(const V4PartShape& s, size_t tokens) {
  const size_t entry = V4EntryBytes(s.head_dim, s.rope_dim), key = V4IndexKeyBytes(s.index_dim);
  size_t bytes = 0;
  for (uint32_t r : s.compress_ratios) {
    if (r > 0) bytes += tokens / r * entry;
    if (r == 4) bytes += tokens / r * key;
  }
  return bytes;
}

size_t V4RestorePointBytes(const V4PartShape& s, uint64_t boundary) {
  const size_t window = static_cast<size_t>(std::min<uint64_t>(s.window, boundary));
  size_t bytes = kV4BoundaryBytes;
  for (uint32_t r : s.compress_ratios) {
    bytes += window * V4EntryBytes(s.head_dim, s.rope_dim);
    if (r == 4) bytes += V4OverlapRowBytes(s.head_dim) + V4OverlapRowBytes(s.index_dim);
  }
  return bytes;
}

Status EncodeV4Entry(std::span<const float> values, size_t rope_dim, std::span<uint8_t> out) {
  const size_t dim = values.size(), fp8 = dim - rope_dim;
  if (rope_dim >= dim || fp8 % kFp8Block != 0 || out.size() != V4EntryBytes(dim, rope_dim)) {
    return InvalidArgument("V4 entry: sizes do not fit (" + std::to_string(dim) + " values, " +
                           std::to_string(out.size()) + " bytes)");
  }
  uint8_t* scales = out.data() + fp8;
  for (size_t b = 0; b < fp8 / kFp8Block; ++b) {
    const std::span<const float> block = values.subspan(b * kFp8Block, kFp8Block);
    float amax = 0.0f;
    for (float v : block) {
      if (!std::isfinite(v)) return Lossy("a value that is not finite");
      amax = std::max(amax, std::fabs(v));
    }
    const int k = ScaleExponent(amax, kFp8E4m3Max);
    scales[b] = static_cast<uint8_t>(k + 127);
    for (size_t i = 0; i < kFp8Block; ++i) {
      const float q = std::ldexp(block[i], -k);
      const uint8_t code = FloatToFp8E4m3(q);
      if (Fp8E4m3ToFloat(code) != q) return Lossy("a value off the FP8 grid of its block");
      out[b * kFp8Block + i] = code;
    }
  }
  uint8_t* rotated = scales + fp8 / kFp8Block;
  for (size_t i = 0; i < rope_dim; ++i) {
    const float v = values[fp8 + i];
    const uint16_t h = FloatToBf16(v);
    if (!std::isfinite(v) || Bf16ToFloat(h) != v) return Lossy("a rotated value that is not a bf16");
    std::memcpy(rotated + 2 * i, &h, 2);
  }
  out.back() = 0;
  return OkStatus();
}

Status DecodeV4Entry(std::span<const uint8_t> bytes, size_t rope_dim, std::span<float> values) {
  const size_t dim = values.size(), fp8 = dim - rope_dim;
  if (rope_dim >= dim || fp8 % kFp8Block != 0 || bytes.size() != V4EntryBytes(dim, rope_dim)) {
    return InvalidArgument("V4 entry: sizes do not fit");
  }
  const uint8_t* scales = bytes.data() + fp8;
  for (size_t b = 0; b < fp8 / kFp8Block; ++b) {
    if (scales[b] == 0xff) return InvalidArgument("V4 entry: an E8M0 scale is NaN");
    const float scale = E8m0ToFloat(scales[b]);
    for (size_t i = b * kFp8Block; i < (b + 1) * kFp8Block; ++i) {
      if ((bytes[i] & 0x7f) == 0x7f) return InvalidArgument("V4 entry: an FP8 code is NaN");
      values[i] = Fp8E4m3ToFloat(bytes[i]) * scale;
      // A large code times a scale near 2^127 is past float's range.
      if (!std::isfinite(values[i])) return InvalidArgument("V4 entry: a value overflows float32");
    }
  }
  const uint8_t* rotated = scales + fp8 / kFp8Block;
  for (size_t i = 0; i < rope_dim; ++i) {
    uint16_t h;
    std::memcpy(&h, rotated + 2 * i, 2);
    values[fp8 + i] = Bf16ToFloat(h);
    if (!std::isfinite(values[fp8 + i])) return InvalidArgument("V4 entry: a rotated value is not finite");
  }
  // Bytes an encoder wrote always have it 0: anything else was not made here.
  if (bytes.back() != 0) return InvalidArgument("V4 entry: the pad byte is not 0");
  return OkStatus();
}

Status EncodeV4IndexKey(std::span<const float> values, std::span<uint8_t> out) {
  const size_t dim = values.size();
  if (dim % kFp4Block != 0 || out.size() != V4IndexKeyBytes(dim)) {
    return InvalidArgument("V4 index key: sizes do not fit");
  }
  uint8_t* scales = out.data() + dim / 2;
  for (size_t b = 0; b < dim / kFp4Block; ++b) {
    float amax = 0.0f;
    for (size_t i = b * kFp4Block; i < (b + 1) * kFp4Block; ++i) {
      if (!std::isfinite(values[i])) return Lossy("a key value that is not finite");
      amax = std::max(amax, std::fabs(values[i]));
    }
    const int k = ScaleExponent(amax, 6.0f);
    scales[b] = static_cast<uint8_t>(k + 127);
    for (size_t i = b * kFp4Block; i < (b + 1) * kFp4Block; ++i) {
      const float q = std::ldexp(values[i], -k);
      const uint8_t code = NearestE2m1Code(std::clamp(q, -6.0f, 6.0f));
      if (E2m1ToFloat(code) != q) return Lossy("a key value off the FP4 grid of its block");
      if (i % 2 == 0) {
        out[i / 2] = static_cast<uint8_t>(code);
      } else {
        out[i / 2] = static_cast<uint8_t>(out[i / 2] | code << 4);
      }
    }
  }
  return OkStatus();
}

Status DecodeV4IndexKey(std::span<const uint8_t> bytes, std::span<float> values) {
  const size_t dim = values.size();
  if (dim % kFp4Block != 0 || bytes.size() != V4IndexKeyBytes(dim)) {
    return InvalidArgument("V4 index key: sizes do not fit");
  }
  const uint8_t* scales = bytes.data() + dim / 2;
  for (size_t b = 0; b < dim / kFp4Block; ++b) {
    if (scales[b] == 0xff) return InvalidArgument("V4 index key: an E8M0 scale is NaN");
    const float scale = E8m0ToFloat(scales[b]);
    for (size_t i = b * kFp4Block; i < (b + 1) * kFp4Block; ++i) {
      values[i] = E2m1ToFloat(static_cast<uint8_t>(bytes[i / 2] >> (i % 2 == 0 ? 0 : 4))) * scale;
      if (!std::isfinite(values[i])) return InvalidArgument("V4 index key: a value overflows float32");
    }
  }
  return OkStatus();
}

}  // namespace kvtier::kernels
