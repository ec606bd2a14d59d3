// The latent layout: everything that changes the bytes of a block, and its
// 64-bit fingerprint (layout_id) that block headers and keys carry.
#ifndef KVTIER_SERVICES_KVBLOCK_LAYOUT_H_
#define KVTIER_SERVICES_KVBLOCK_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/kernels/codec.h"
#include "kvtier/v1/layout.pb.h"

namespace kvtier::kvblock {

inline constexpr uint32_t kBlockFormatVersion = 1;
inline constexpr uint32_t kMaxLayers = 1024;
inline constexpr size_t kMaxModelIdBytes = 256;

// Plain value type.
struct LatentLayout {
  std::string model_id;
  uint32_t num_layers = 0;
  uint32_t kv_lora_rank = 0;
  uint32_t rope_dim = 0;
  uint32_t tokens_per_block = 64;
  kernels::Codec codec = kernels::Codec::kInt8;
  uint32_t block_format_version = kBlockFormatVersion;

  // Shape of one layer of one full block.
  kernels::BlockShape LayerShape() const { return {tokens_per_block, kv_lora_rank, rope_dim}; }
  // Codec payload bytes of one layer of one full block.
  size_t LayerPayloadBytes() const { return kernels::EncodedBytes(codec, LayerShape()); }

  bool operator==(const LatentLayout&) const = default;
};

// INVALID_ARGUMENT naming the field when a value is out of range, or when the
// block format version is not one this build reads.
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
