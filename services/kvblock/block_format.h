// The byte format of a latent block record: what the cache stores, what Put
// slices and Get answers carry. Described in block_format.md; this file and
// that one are the only definitions.
//
//   offset size  field (little-endian)
//   0      4     magic "KVTB"
//   4      2     format version (1, or 2 with indexer keys)
//   6      1     codec (kernels::Codec)
//   7      1     flags, 0
//   8      8     layout_id (services/kvblock/layout.h)
//   16     4     token count
//   20     2     first layer
//   22     2     layer count
//   24     2     latent dim (kv_lora_rank)
//   26     2     rope dim
//   28     4     bytes per layer payload (latent part + indexer part)
//   format 2 only:
//   32     2     indexer dim
//   34     1     indexer encoding (IndexerEncoding)
//   35     1     reserved, 0
//   36     4     bytes per layer of the indexer part
//   32|40  ...   layer count payloads, first layer first; each the latent
//                part (kernels::EncodedBytes) then the indexer part
//   end-4  4     CRC32C of every byte before it
//
// Format 3 (DeepSeek-V4) keeps format 1's 32 bytes of header, with byte 7
// the record's kind (0 a block, 1 a restore point), every layer in one
// record (first layer 0), head_dim and its rotated dims at 24 and 26, and
// at 28 the whole payload's bytes (per-layer parts differ in size); its
// payloads are services/runtime/v4_cache_parts.h's.
#ifndef KVTIER_SERVICES_KVBLOCK_BLOCK_FORMAT_H_
#define KVTIER_SERVICES_KVBLOCK_BLOCK_FORMAT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kvtier/kernels/codec.h"
#include "services/kvblock/layout.h"

namespace kvtier::kvblock {

inline constexpr char kBlockMagic[4] = {'K', 'V', 'T', 'B'};
inline constexpr size_t kBlockHeaderBytes = 32;         // format 1
inline constexpr size_t kIndexedBlockHeaderBytes = 40;  // format 2
inline constexpr size_t kBlockTrailerBytes = 4;

// What a format 3 record holds (its byte 7).
enum class RecordKind : uint8_t { kBlock = 0, kRestorePoint = 1 };

struct BlockHeader {
  uint32_t format_version = kBlockFormatVersion;
  kernels::Codec codec = kernels::Codec::kInt8;
  uint64_t layout_id = 0;
  uint32_t token_count = 0;
  uint32_t layer_begin = 0;
  uint32_t layer_count = 0;
  uint32_t latent_dim = 0;
  uint32_t rope_dim = 0;
  uint32_t layer_payload_bytes = 0;  // latent part + indexer part
  uint32_t indexer_dim = 0;
  IndexerEncoding indexer_encoding = IndexerEncoding::kNone;
  uint32_t indexer_part_bytes = 0;
  RecordKind kind = RecordKind::kBlock;  // format 3
  uint32_t payload_bytes = 0;            // format 3: every layer's parts together

  kernels::BlockShape LayerShape() const { return {token_count, latent_dim, rope_dim}; }
  size_t HeaderBytes() const {
    return format_version == kIndexedBlockFormatVersion ? kIndexedBlockHeaderBytes : kBlockHeaderBytes;
  }
  size_t LatentPartBytes() const { return layer_payload_bytes - indexer_part_bytes; }
  size_t PayloadBytes() const {
    return format_version == kV4BlockFormatVersion ? payload_bytes : size_t{layer_count} * layer_payload_bytes;
  }
  // Size of the whole record.
  size_t RecordBytes() const { return HeaderBytes() + PayloadBytes() + kBlockTrailerBytes; }
};

// Header for layers [layer_begin, layer_begin + layer_count) of a full block
// of `layout` (a V4 layout's: a block of every layer).
BlockHeader HeaderFor(const LatentLayout& layout, uint32_t layer_begin, uint32_t layer_count);

// A parsed record; points into the parsed bytes, which must outlive it.
struct BlockView {
  BlockHeader header;
  std::string_view payloads;  // PayloadBytes() bytes; Layer() and the parts below for formats 1 and 2

  // Layer i's whole payload, its latents (the codec's bytes) and its
  // indexer keys (empty in format 1).
  std::string_view Layer(uint32_t i) const {
    return payloads.substr(size_t{i} * header.layer_payload_bytes, header.layer_payload_bytes);
  }
  std::string_view LatentPart(uint32_t i) const { return Layer(i).substr(0, header.LatentPartBytes()); }
  std::string_view IndexerPart(uint32_t i) const { return Layer(i).substr(header.LatentPartBytes()); }
};

// Whether ParseBlock reads the record for its CRC32C. kCheckedBefore only
// for bytes whose CRC was verified where they now lie, as they were
// written there (ShardSet::Fetch's records): it saves a pass over them.
enum class CrcCheck { kCheck, kCheckedBefore };

// Parses a record without trusting it (for format 3 against a layout, its
// payload's size: a block's, or a restore point's at the boundary its
// first 8 bytes name, a positive multiple of tokens_per_block). Errors,
// each naming what is wrong:
//   INVALID_ARGUMENT     bad magic, bad header fields, truncated or oversized
//   FAILED_PRECONDITION  unsupported format version; record not of `expected`
//                        (layout id, codec, dims, token count, layer range)
//   DATA_LOSS            CRC32C mismatch
// `expected` may be null to accept any layout.
absl::StatusOr<BlockView> ParseBlock(std::string_view record, const LatentLayout* expected = nullptr,
                                     CrcCheck crc_check = CrcCheck::kCheck);

// The header of a `size`-byte record whose first bytes are `head` (all of
// its header, or all of the record when shorter), checked as ParseBlock
// checks it but for the CRC and the layout.
absl::StatusOr<BlockHeader> ParseBlockHeader(std::string_view head, size_t size);

// The header bytes of a record (HeaderBytes() of them); the caller has
// checked the fields.
std::string EncodeBlockHeader(const BlockHeader& header);

// Serializes `header` and `payloads` (exactly layer_count * layer_payload_bytes
// bytes) into a record with its CRC32C.
absl::StatusOr<std::string> SerializeBlock(const BlockHeader& header, std::string_view payloads);

// Quantizes float latents [layer_count][tokens_per_block][kv_lora_rank +
// rope_dim] with the layout's codec and serializes them as one record;
// for a layout with indexer keys, each layer's with its indexer part from
// `indexer_parts` ([layer_count][IndexerPartBytes()], already encoded: the
// model rounds its keys itself).
absl::StatusOr<std::string> EncodeBlock(const LatentLayout& layout, uint32_t layer_begin, uint32_t layer_count,
                                        std::span<const float> latents, std::span<const uint8_t> indexer_parts = {});

// A DeepSeek-V4 record (format 3) of `layout` holding `payload`, a block
// or a restore point (services/runtime/v4_cache_parts.h's bytes), checked
// for its size as ParseBlock checks it.
absl::StatusOr<std::string> EncodeV4Record(const LatentLayout& layout, RecordKind kind, std::string_view payload);

// Dequantizes the latents of every layer of a parsed record into `out`
// (same shape as EncodeBlock's input).
absl::Status DecodeBlock(const BlockView& block, std::span<float> out);

// A record held in pieces of memory, in order (a tier's pages, say): copies
// its bytes [offset, offset + out.size()) into `out`.
void CopyFromPieces(std::span<const std::span<const uint8_t>> pieces, size_t offset, std::span<uint8_t> out);
// Checks a record held in `pieces` as ParseBlock does (CRC included) and
// returns its header; the record is not copied.
absl::StatusOr<BlockHeader> ParseScatteredBlock(std::span<const std::span<const uint8_t>> pieces,
                                                const LatentLayout* expected);
// The CRC32C in the trailer of a `size`-byte record held in `pieces`.
uint32_t TrailerCrc(std::span<const std::span<const uint8_t>> pieces, size_t size);

}  // namespace kvtier::kvblock

#endif  // KVTIER_SERVICES_KVBLOCK_BLOCK_FORMAT_H_
