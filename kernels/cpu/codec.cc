// Codec names, sizes and argument checks; dispatch to the per-codec files.
#include "kvtier/kernels/codec.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "codec_internal.h"
#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels {

const char* CodecName(Codec codec) {
  switch (codec) {
    case Codec::kBf16:
      return "bf16";
    case Codec::kFp8:
      return "fp8";
    case Codec::kInt8:
      return "int8";
    case Codec::kInt4:
      return "int4";
  }
  return "unknown";
}

std::optional<Codec> ParseCodec(std::string_view name) {
  for (Codec c : kAllCodecs) {
    if (CodecName(c) == name) return c;
  }
  return std::nullopt;
}

bool IsKnownCodec(uint8_t value) { return value >= 1 && value <= 4; }

Status ValidateShape(BlockShape shape) {
  if (shape.tokens < 1 || shape.tokens > kMaxBlockTokens) {
    return InvalidArgument("block token count " + std::to_string(shape.tokens) + " outside 1.." +
                           std::to_string(kMaxBlockTokens));
  }
  if (shape.latent_dim < 1 || shape.latent_dim > kMaxLatentDim) {
    return InvalidArgument("latent dim " + std::to_string(shape.latent_dim) + " outside 1.." +
                           std::to_string(kMaxLatentDim));
  }
  if (shape.rope_dim > kMaxLatentDim) {
    return InvalidArgument("rope dim " + std::to_string(shape.rope_dim) + " above " + std::to_string(kMaxLatentDim));
  }
  return OkStatus();
}

size_t EncodedBytes(Codec codec, BlockShape shape) {
  if (!ValidateShape(shape).ok()) return 0;
  const size_t t = shape.tokens;
  const size_t dim = shape.dim();
  switch (codec) {
    case Codec::kBf16:
      return t * dim * 2;
    case Codec::kFp8: {
      const size_t tiles = (shape.latent_dim + kFp8TileSize - 1) / kFp8TileSize;
      return t * (shape.latent_dim + 4 * tiles + 2 * size_t{shape.rope_dim});
    }
    case Codec::kInt8:
      return dim * 2 + t * dim;
    case Codec::kInt4:
      return dim * 4 + t * ((dim + 1) / 2);
  }
  return 0;
}

namespace {

Status CheckSizes(Codec codec, BlockShape shape, size_t values, size_t bytes) {
  if (Status s = ValidateShape(shape); !s.ok()) return s;
  if (!IsKnownCodec(static_cast<uint8_t>(codec))) {
    return InvalidArgument("unknown codec " + std::to_string(static_cast<int>(codec)));
  }
  if (values != shape.values()) {
    return InvalidArgument("float buffer holds " + std::to_string(values) + " values, shape needs " +
                           std::to_string(shape.values()));
  }
  const size_t want = EncodedBytes(codec, shape);
  if (bytes != want) {
    return InvalidArgument(std::string(CodecName(codec)) + " payload is " + std::to_string(bytes) +
                           " bytes, shape needs " + std::to_string(want));
  }
  return OkStatus();
}

}  // namespace

Status Quantize(Codec codec, BlockShape shape, std::span<const float> in, std::span<uint8_t> out) {
  if (Status s = CheckSizes(codec, shape, in.size(), out.size()); !s.ok()) return s;
  switch (codec) {
    case Codec::kBf16:
      return cpu::QuantizeBf16(shape, in.data(), out.data());
    case Codec::kFp8:
      return cpu::QuantizeFp8(shape, in.data(), out.data());
    case Codec::kInt8:
      return cpu::QuantizeInt8(shape, in.data(), out.data());
    case Codec::kInt4:
      return cpu::QuantizeInt4(shape, in.data(), out.data());
  }
  return InvalidArgument("unknown codec");
}

Status Dequantize(Codec codec, BlockShape shape, std::span<const uint8_t> in, std::span<float> out) {
  if (Status s = CheckSizes(codec, shape, out.size(), in.size()); !s.ok()) return s;
  switch (codec) {
    case Codec::kBf16:
      cpu::DequantizeBf16(shape, in.data(), out.data());
      break;
    case Codec::kFp8:
      cpu::DequantizeFp8(shape, in.data(), out.data());
      break;
    case Codec::kInt8:
      cpu::DequantizeInt8(shape, in.data(), out.data());
      break;
    case Codec::kInt4:
      cpu::DequantizeInt4(shape, in.data(), out.data());
      break;
  }
  return OkStatus();
}

Status DequantizeTokens(Codec codec, BlockShape shape, std::span<const uint8_t> in, std::span<const uint32_t> tokens,
                        std::span<float> out) {
  if (Status s = CheckSizes(codec, shape, shape.values(), in.size()); !s.ok()) return s;
  if (tokens.empty() || tokens.size() > shape.tokens || out.size() != tokens.size() * shape.dim()) {
    return InvalidArgument("DequantizeTokens: " + std::to_string(tokens.size()) + " tokens of " +
                           std::to_string(shape.tokens) + ", or an output that is not one row each");
  }
  // A block of the same header and those tokens' rows decodes as the rows
  // do in the whole block: each codec decodes token by token.
  const BlockShape part{static_cast<uint32_t>(tokens.size()), shape.latent_dim, shape.rope_dim};
  const BlockShape one{1, shape.latent_dim, shape.rope_dim};
  const size_t row = EncodedBytes(codec, {2, shape.latent_dim, shape.rope_dim}) - EncodedBytes(codec, one);
  const size_t header = EncodedBytes(codec, one) - row;
  std::vector<uint8_t> block(EncodedBytes(codec, part));
  std::copy_n(in.data(), header, block.data());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= shape.tokens) {
      return InvalidArgument("DequantizeTokens: token " + std::to_string(tokens[i]) + " of " +
                             std::to_string(shape.tokens));
    }
    std::copy_n(in.data() + header + size_t{tokens[i]} * row, row, block.data() + header + i * row);
  }
  return Dequantize(codec, part, block, out);
}

namespace cpu {

KVTIER_VECTOR_CLONES Status CheckFinite(BlockShape shape, const float* in) {
  const size_t n = shape.values();
  // Largest |x| bit pattern; non-negative floats order like their bits, and
  // an integer max vectorizes where a float reduction would not.
  uint32_t max_bits = 0;
  for (size_t i = 0; i < n; ++i) max_bits = std::max(max_bits, FloatBits(in[i]) & 0x7fffffffu);
  if (max_bits < 0x7f800000u) return OkStatus();
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(in[i])) {
      return InvalidArgument("non-finite input " + std::to_string(in[i]) + " at token " +
                             std::to_string(i / shape.dim()) + ", channel " + std::to_string(i % shape.dim()));
    }
  }
  return OkStatus();
}

}  // namespace cpu
}  // namespace kvtier::kernels
