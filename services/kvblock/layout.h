// The latent layout: everything that changes the bytes of a block, and its
// 64-bit fingerprint (layout_id) that block headers and keys carry.
#ifndef KVTIER_SERVICES_KVBLOCK_LAYOUT_H_
#define KVTIER_SERVICES_KVBLOCK_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/v4_entry.h"
#include "kvtier/v1/layout.pb.h"

namespace kvtier::kvblock {

// Block format versions (block_format.md): 1, latents alone; 2, each
// layer's latents then its tokens' indexer keys (DeepSeek-V3.2); 3,
// DeepSeek-V4's blocks and restore points.
inline constexpr uint32_t kBlockFormatVersion = 1;
inline constexpr uint32_t kIndexedBlockFormatVersion = 2;
inline constexpr uint32_t kV4BlockFormatVersion = 3;
inline constexpr uint32_t kMaxLayers = 1024;
inline constexpr size_t kMaxModelIdBytes = 256;
inline constexpr uint32_t kMaxIndexerDim = 4096;

// How a block carries its tokens' indexer keys (kvtier.v1.IndexerEncoding;
// the byte in a format 2 header).
enum class IndexerEncoding : uint8_t {
  kNone = 0,  // no indexer part: DeepSeek-V2 and V3 layouts
  // Per layer [tokens][dim] e4m3fn codes, then [tokens] f32 scales: the
  // keys exactly as the model rounds them (kernels/indexer.h).
  kFp8 = 1,
  // DeepSeek-V4's keys (format 3), each MXFP4 as the model rounds it
  // (kernels/v4_entry.h): dim / 2 bytes of E2M1 codes, dim / 32 E8M0 scales.
  kMxfp4 = 2,
};
// Bytes of one layer's indexer part of `tokens` tokens; 0 for kNone.
size_t IndexerPartBytes(IndexerEncoding encoding, uint32_t tokens, uint32_t dim);

// Plain value type.
struct LatentLayout {
  std::string model_id;
  uint32_t num_layers = 0;
  uint32_t kv_lora_rank = 0;
  uint32_t rope_dim = 0;
  uint32_t tokens_per_block = 64;
  kernels::Codec codec = kernels::Codec::kInt8;
  uint32_t block_format_version = kBlockFormatVersion;
  // DeepSeek-V3.2: each token's indexer key beside its latent (format 2);
  // 0 and kNone for every other model.
  uint32_t indexer_dim = 0;
  IndexerEncoding indexer_encoding = IndexerEncoding::kNone;
  // DeepSeek-V4 (format 3; empty and 0 for every other model): each
  // layer's compress ratio and the sliding window. kv_lora_rank is then the
  // entries' head_dim, rope_dim their rotated dims, codec kFp8 (the model's
  // own FP8 entries), and indexer_dim/kMxfp4 the CSA layers' keys.
  std::vector<uint32_t> compress_ratios = {};
  uint32_t sliding_window = 0;

  // Shape of one layer of one full block.
  kernels::BlockShape LayerShape() const { return {tokens_per_block, kv_lora_rank, rope_dim}; }
  // Codec payload bytes of one layer's latents in one full block.
  size_t LatentPartBytes() const { return kernels::EncodedBytes(codec, LayerShape()); }
  // Bytes of one layer's indexer keys in one full block (0 without them).
  size_t IndexerPartBytes() const { return kvblock::IndexerPartBytes(indexer_encoding, tokens_per_block, indexer_dim); }
  // Payload bytes of one layer of one full block: latents, indexer keys.
  size_t LayerPayloadBytes() const { return LatentPartBytes() + IndexerPartBytes(); }

  bool IsV4() const { return !compress_ratios.empty(); }
  kernels::V4PartShape V4Parts() const {
    return {compress_ratios, kv_lora_rank, rope_dim, indexer_dim, sliding_window};
  }

  bool operator==(const LatentLayout&) const = default;
};

// The block format version of a layout's blocks: 2 with an indexer part,
// else 1 (V4 layouts: 3).
uint32_t FormatVersionFor(IndexerEncoding encoding);

// INVALID_ARGUMENT naming the field when a value is out of range, when the
// indexer fields disagree (a dim without an encoding, or the reverse), or
// when the block format version is not the one the layout's blocks have;
// for a V4 layout, also when a ratio does not divide tokens_per_block, the
// ratios are not one a layer, ratio-4 layers have no MXFP4 indexer (or
// others one), or the entries are not FP8 of whole 64-value blocks.
absl::Status ValidateLayout(const LatentLayout& layout);

// First 8 bytes (little-endian) of SHA-256 over the canonical encoding of
// every field. Equal layouts give equal ids; any field change changes it.
uint64_t LayoutId(const LatentLayout& layout);

// Conversions to and from the wire. FromProto validates, and checks a
// non-zero layout_id against the one it computes.
absl::StatusOr<LatentLayout> LayoutFromProto(const v1::LatentLayout& proto);
v1::LatentLayout LayoutToProto(const LatentLayout& layout);

// "device", "host", "disk" ("unspecified"): metric labels and CLI columns.
std::string TierName(v1::Tier tier);

}  // namespace kvtier::kvblock

#endif  // KVTIER_SERVICES_KVBLOCK_LAYOUT_H_
