// DeepSeek-V4's cache entries in the byte formats its serving stacks
// store (FlashMLA's "MODEL1" layout, vLLM's): an attention entry of
// head_dim values is its non-rotated dims in FP8 E4M3 (blocks of 64, one
// power-of-two E8M0 scale each), its rotated dims in bf16, and a pad byte;
// an indexer key is MXFP4 (E2M1 codes two to a byte, the first in the low
// nibble, one E8M0 scale per 32). Values the model itself rounded to these
// formats (kernels/qat_rounding.h, rotated dims held in bf16) come back
// bit for bit: the cache is lossless for them.
#ifndef KVTIER_KERNELS_V4_ENTRY_H_
#define KVTIER_KERNELS_V4_ENTRY_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvtier/kernels/status.h"

namespace kvtier::kernels {

// Bytes of an entry of `dim` values whose last `rope_dim` are rotated:
// (dim - rope_dim) FP8 codes, their (dim - rope_dim) / 64 scales, rope_dim
// bf16 values, and one pad byte (584 at V4's 512 and 64).
size_t V4EntryBytes(size_t dim, size_t rope_dim);
// Bytes of an MXFP4 indexer key of `dim` values (68 at V4's 128).
size_t V4IndexKeyBytes(size_t dim);

// What shapes the parts a cache keeps of a V4 sequence
// (services/runtime/v4_cache_parts.h, services/kvblock/block_format.md):
// each layer's compress ratio (0: window only; 4: overlapping groups and an
// indexer), the entries' and keys' dims, and the window.
struct V4PartShape {
  std::span<const uint32_t> compress_ratios;
  size_t head_dim = 0, rope_dim = 0, index_dim = 0, window = 0;
};
// A block of `tokens` tokens: per layer its closed groups' entries, and on
// ratio-4 layers their indexer keys.
size_t V4BlockBytes(const V4PartShape& shape, size_t tokens);
// A restore point after `boundary` tokens: the boundary (8 bytes), then per
// layer the window's entries before it and, on ratio-4 layers, both
// compressors' last group's first-half rows (4 of kv and 4 of score each,
// float32).
size_t V4RestorePointBytes(const V4PartShape& shape, uint64_t boundary);
inline constexpr size_t kV4BoundaryBytes = 8;
// The rows an overlapping compressor of `dim` keeps at a boundary.
inline size_t V4OverlapRowBytes(size_t dim) { return 4 * dim * 2 * sizeof(float); }

// INVALID_ARGUMENT when a value cannot be stored without loss: a
// non-rotated block that is not E4M3 codes times a power of two, a rotated
// value that is not a bf16, a key block that is not E2M1 codes times a
// power of two, or a value that is not finite.
Status EncodeV4Entry(std::span<const float> values, size_t rope_dim, std::span<uint8_t> out);
Status DecodeV4Entry(std::span<const uint8_t> bytes, size_t rope_dim, std::span<float> values);
Status EncodeV4IndexKey(std::span<const float> values, std::span<uint8_t> out);
Status DecodeV4IndexKey(std::span<const uint8_t> bytes, std::span<float> values);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_V4_ENTRY_H_
