// Latent codecs: how one layer of one block of MLA latents is stored.
//
// Input is `tokens` rows of float32, each `latent_dim` compressed_kv values
// followed by `rope_dim` k_pe values (V2-Lite: 512 + 64). Each codec's byte
// layout is fixed here and in services/kvblock/block_format.md:
//
//   bf16  [tokens][dim] bf16, round to nearest even (lossless for bf16 input).
//   fp8   per token: [latent e4m3fn][ceil(latent/128) f32 scales][rope bf16],
//         byte-for-byte FlashMLA's FP8 token layout (656 B at 512 + 64). The
//         latent is first rounded to bf16 (FlashMLA's input type); each tile of
//         128 gets scale 2^ceil(log2(max(amax/448, 1e-4))).
//   int8  [dim] bf16 scales, then [tokens][dim] int8 codes. Symmetric, one scale
//         per channel over the block's tokens: x ~= code * scale, |code| <= 127.
//   int4  [dim] bf16 scales, [dim] bf16 zero points, then [tokens][ceil(dim/2)]
//         bytes; byte k holds channel k in its low nibble and channel
//         k + ceil(dim/2) in its high nibble (0 when dim is odd).
//         Asymmetric per channel: x ~= zero + code * scale, code in 0..15.
//
// Scales are rounded up and zero points down when stored, so the stored values
// still cover every input: each element's error is at most half its step.
// All functions are pure and thread-safe.
#ifndef KVTIER_KERNELS_CODEC_H_
#define KVTIER_KERNELS_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "kvtier/kernels/status.h"

namespace kvtier::kernels {

// Values are part of the block format and the wire protocol: never renumber.
enum class Codec : uint8_t { kBf16 = 1, kFp8 = 2, kInt8 = 3, kInt4 = 4 };

inline constexpr Codec kAllCodecs[] = {Codec::kBf16, Codec::kFp8, Codec::kInt8, Codec::kInt4};

// "bf16", "fp8", "int8", "int4" (a static string).
const char* CodecName(Codec codec);
std::optional<Codec> ParseCodec(std::string_view name);
bool IsKnownCodec(uint8_t value);

// Limits that keep every size computation far from overflow.
inline constexpr uint32_t kMaxBlockTokens = 4096;
inline constexpr uint32_t kMaxLatentDim = 16384;
inline constexpr uint32_t kFp8TileSize = 128;
// Smallest scale the integer codecs store; keeps 1/scale finite. Channels
// whose values are all below it in magnitude still meet the half-step bound.
inline constexpr float kMinIntScale = 0x1p-120f;

// One layer of one block.
struct BlockShape {
  uint32_t tokens = 0;
  uint32_t latent_dim = 0;
  uint32_t rope_dim = 0;

  uint32_t dim() const { return latent_dim + rope_dim; }
  size_t values() const { return size_t{tokens} * dim(); }
};

// OK when the shape is within the limits above (tokens >= 1, latent_dim >= 1).
Status ValidateShape(BlockShape shape);

// Bytes one layer of one block takes in `codec`; 0 for an invalid shape.
size_t EncodedBytes(Codec codec, BlockShape shape);

// Encodes `in` (shape.values() floats) into `out` (EncodedBytes bytes).
// Rejects non-finite input, and values a codec cannot represent, with
// INVALID_ARGUMENT naming the token and channel; `out` is then unspecified.
Status Quantize(Codec codec, BlockShape shape, std::span<const float> in, std::span<uint8_t> out);

// Decodes `in` (exactly EncodedBytes bytes) into `out` (shape.values()
// floats). Reads nothing outside `in`; sizes are checked, contents are not
// (the block format's CRC32C is what vouches for them).
Status Dequantize(Codec codec, BlockShape shape, std::span<const uint8_t> in, std::span<float> out);

// Decodes the tokens `tokens` of the block `in` into `out` (one row of
// shape.dim() floats each, in that order), the same bits as their rows of
// Dequantize, reading only the block's scales (once) and those tokens'
// bytes (every layout above is a header, empty for bf16 and fp8, then one
// row of bytes a token): what sparse attention reads of a block it takes a
// few tokens from.
Status DequantizeTokens(Codec codec, BlockShape shape, std::span<const uint8_t> in, std::span<const uint32_t> tokens,
                        std::span<float> out);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_CODEC_H_
