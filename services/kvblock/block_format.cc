#include "services/kvblock/block_format.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
#include "services/kvblock/crc32c.h"

namespace kvtier::kvblock {
namespace {

template <typename T>
T Load(std::string_view bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

template <typename T>
void Store(char* bytes, size_t offset, T v) {
  std::memcpy(bytes + offset, &v, sizeof v);
}

// A format 3 header's own fields: a V4 record holds every layer.
absl::Status CheckV4HeaderFields(const BlockHeader& h) {
  if (h.kind != RecordKind::kBlock && h.kind != RecordKind::kRestorePoint) {
    return absl::InvalidArgumentError(absl::StrCat("block header: record kind ", static_cast<int>(h.kind),
                                                   " (format 3 takes 0, a block, or 1, a restore point)"));
  }
  if (h.codec != kernels::Codec::kFp8 || h.layer_begin != 0) {
    return absl::InvalidArgumentError("block header: a format 3 record is FP8 entries of every layer from layer 0");
  }
  const size_t least = h.kind == RecordKind::kRestorePoint ? kernels::kV4BoundaryBytes : 0;
  if (h.payload_bytes < least) {
    return absl::InvalidArgumentError(
        absl::StrCat("block header: a restore point of ", h.payload_bytes, " bytes has no boundary"));
  }
  return absl::OkStatus();
}

absl::Status CheckHeaderFields(const BlockHeader& h) {
  if (kernels::Status s = kernels::ValidateShape(h.LayerShape()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("block header: ", s.message()));
  }
  if (h.layer_count < 1 || h.layer_begin + h.layer_count > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat("block header: layers [", h.layer_begin, ", ",
                                                   h.layer_begin + h.layer_count, ") empty or beyond ", kMaxLayers));
  }
  if (h.format_version == kV4BlockFormatVersion) return CheckV4HeaderFields(h);
  const bool indexed = h.format_version == kIndexedBlockFormatVersion;
  if (indexed && (h.indexer_encoding != IndexerEncoding::kFp8 || h.indexer_dim < 1 || h.indexer_dim > kMaxIndexerDim)) {
    return absl::InvalidArgumentError(absl::StrCat("block header: indexer encoding ",
                                                   static_cast<int>(h.indexer_encoding), " of dim ", h.indexer_dim,
                                                   " (format 2 takes encoding 1, dim 1..", kMaxIndexerDim, ")"));
  }
  if (!indexed && (h.indexer_encoding != IndexerEncoding::kNone || h.indexer_dim != 0)) {
    return absl::InvalidArgumentError("block header: format 1 has no indexer part");
  }
  const size_t indexer = IndexerPartBytes(h.indexer_encoding, h.token_count, h.indexer_dim);
  if (h.indexer_part_bytes != indexer) {
    return absl::InvalidArgumentError(absl::StrCat("block header: ", h.indexer_part_bytes,
                                                   " indexer bytes per layer, but ", h.token_count, " keys of dim ",
                                                   h.indexer_dim, " take ", indexer));
  }
  const size_t latent = kernels::EncodedBytes(h.codec, h.LayerShape());
  if (h.layer_payload_bytes != latent + indexer) {
    return absl::InvalidArgumentError(
        absl::StrCat("block header: ", h.layer_payload_bytes, " bytes per layer, but ", kernels::CodecName(h.codec),
                     " at ", h.token_count, " tokens x (", h.latent_dim, " + ", h.rope_dim, ") takes ", latent,
                     indexer > 0 ? absl::StrCat(" + ", indexer, " of indexer keys") : ""));
  }
  return absl::OkStatus();
}

// A format 3 record's size against its layout's; `boundary`: a restore
// point's first 8 bytes.
absl::Status CheckV4Size(const BlockHeader& h, const LatentLayout& l, uint64_t boundary) {
  if (h.layer_count != l.num_layers) {
    return absl::FailedPreconditionError(
        absl::StrCat("a DeepSeek-V4 record holds ", h.layer_count, " layers, layout has ", l.num_layers));
  }
  size_t want = 0;
  if (h.kind == RecordKind::kBlock) {
    want = kernels::V4BlockBytes(l.V4Parts(), l.tokens_per_block);
  } else {
    if (boundary == 0 || boundary % l.tokens_per_block != 0 || boundary > (uint64_t{1} << 40)) {
      return absl::InvalidArgumentError(absl::StrCat("restore point at token ", boundary, ", not a block boundary of ",
                                                     l.tokens_per_block, " tokens"));
    }
    want = kernels::V4RestorePointBytes(l.V4Parts(), boundary);
  }
  if (h.payload_bytes != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        h.kind == RecordKind::kBlock ? "block" : "restore point", " payload of ", h.payload_bytes,
        " bytes, the layout's ", h.kind == RecordKind::kBlock ? "blocks take " : "points there take ", want));
  }
  return absl::OkStatus();
}

absl::Status CheckAgainstLayout(const BlockHeader& h, const LatentLayout& l, uint64_t boundary) {
  const uint64_t id = LayoutId(l);
  if (h.layout_id != id) {
    return absl::FailedPreconditionError(absl::StrCat("block has layout id ", absl::Hex(h.layout_id, absl::kZeroPad16),
                                                      ", expected ", absl::Hex(id, absl::kZeroPad16), " (", l.model_id,
                                                      ", ", kernels::CodecName(l.codec), ")"));
  }
  if (h.codec != l.codec || h.token_count != l.tokens_per_block || h.latent_dim != l.kv_lora_rank ||
      h.rope_dim != l.rope_dim) {
    return absl::FailedPreconditionError(
        absl::StrCat("block is ", kernels::CodecName(h.codec), " ", h.token_count, " tokens x (", h.latent_dim, " + ",
                     h.rope_dim, "), layout wants ", kernels::CodecName(l.codec), " ", l.tokens_per_block, " x (",
                     l.kv_lora_rank, " + ", l.rope_dim, ")"));
  }
  // Format 3 headers carry no indexer fields: the layout id vouches for them.
  if (h.format_version != kV4BlockFormatVersion &&
      (h.indexer_dim != l.indexer_dim || h.indexer_encoding != l.indexer_encoding)) {
    return absl::FailedPreconditionError(
        absl::StrCat("block has indexer keys of dim ", h.indexer_dim, ", layout wants dim ", l.indexer_dim));
  }
  if (h.layer_begin + h.layer_count > l.num_layers) {
    return absl::FailedPreconditionError(absl::StrCat("block holds layers [", h.layer_begin, ", ",
                                                      h.layer_begin + h.layer_count, "), layout has ", l.num_layers));
  }
  return h.format_version == kV4BlockFormatVersion ? CheckV4Size(h, l, boundary) : absl::OkStatus();
}

// A restore point's boundary: its payload's first 8 bytes (0 for anything
// else).
uint64_t Boundary(const BlockHeader& h, std::string_view payload) {
  if (h.format_version != kV4BlockFormatVersion || h.kind != RecordKind::kRestorePoint ||
      payload.size() < kernels::kV4BoundaryBytes) {
    return 0;
  }
  return Load<uint64_t>(payload, 0);
}

}  // namespace

BlockHeader HeaderFor(const LatentLayout& layout, uint32_t layer_begin, uint32_t layer_count) {
  BlockHeader h;
  h.format_version = layout.block_format_version;
  h.codec = layout.codec;
  h.layout_id = LayoutId(layout);
  h.token_count = layout.tokens_per_block;
  h.layer_begin = layer_begin;
  h.layer_count = layer_count;
  h.latent_dim = layout.kv_lora_rank;
  h.rope_dim = layout.rope_dim;
  if (layout.IsV4()) {  // a block's, every layer's parts together
    h.payload_bytes = static_cast<uint32_t>(kernels::V4BlockBytes(layout.V4Parts(), layout.tokens_per_block));
    return h;
  }
  h.layer_payload_bytes = static_cast<uint32_t>(layout.LayerPayloadBytes());
  h.indexer_dim = layout.indexer_dim;
  h.indexer_encoding = layout.indexer_encoding;
  h.indexer_part_bytes = static_cast<uint32_t>(layout.IndexerPartBytes());
  return h;
}

absl::StatusOr<BlockHeader> ParseBlockHeader(std::string_view record, size_t size) {
  if (size < kBlockHeaderBytes + kBlockTrailerBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("block record truncated: ", size, " bytes, smaller than header and checksum"));
  }
  if (std::memcmp(record.data(), kBlockMagic, sizeof kBlockMagic) != 0) {
    return absl::InvalidArgumentError("block record has bad magic (not a KVTB record)");
  }
  BlockHeader h;
  h.format_version = Load<uint16_t>(record, 4);
  if (h.format_version < kBlockFormatVersion || h.format_version > kV4BlockFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("block format version ", h.format_version,
                                                      " is not supported (this build reads ", kBlockFormatVersion,
                                                      " to ", kV4BlockFormatVersion, ")"));
  }
  if (size < h.HeaderBytes() + kBlockTrailerBytes) {
    return absl::InvalidArgumentError(absl::StrCat("block record truncated: ", size, " bytes, smaller than a format ",
                                                   h.format_version, " header and checksum"));
  }
  const uint8_t codec = Load<uint8_t>(record, 6);
  if (!kernels::IsKnownCodec(codec)) {
    return absl::InvalidArgumentError(absl::StrCat("block header: unknown codec ", codec));
  }
  h.codec = static_cast<kernels::Codec>(codec);
  const uint8_t flags = Load<uint8_t>(record, 7);
  if (h.format_version == kV4BlockFormatVersion) {
    h.kind = static_cast<RecordKind>(flags);
  } else if (flags != 0) {
    return absl::InvalidArgumentError(absl::StrCat("block header: unknown flags ", flags));
  }
  h.layout_id = Load<uint64_t>(record, 8);
  h.token_count = Load<uint32_t>(record, 16);
  h.layer_begin = Load<uint16_t>(record, 20);
  h.layer_count = Load<uint16_t>(record, 22);
  h.latent_dim = Load<uint16_t>(record, 24);
  h.rope_dim = Load<uint16_t>(record, 26);
  if (h.format_version == kV4BlockFormatVersion) {
    h.payload_bytes = Load<uint32_t>(record, 28);
  } else {
    h.layer_payload_bytes = Load<uint32_t>(record, 28);
  }
  if (h.format_version == kIndexedBlockFormatVersion) {
    h.indexer_dim = Load<uint16_t>(record, 32);
    h.indexer_encoding = static_cast<IndexerEncoding>(Load<uint8_t>(record, 34));
    if (const uint8_t reserved = Load<uint8_t>(record, 35); reserved != 0) {
      return absl::InvalidArgumentError(absl::StrCat("block header: reserved byte 35 is ", reserved, ", not 0"));
    }
    h.indexer_part_bytes = Load<uint32_t>(record, 36);
  }
  KVTIER_RETURN_IF_ERROR(CheckHeaderFields(h));
  const size_t want = h.RecordBytes();
  if (size < want) {
    return absl::InvalidArgumentError(absl::StrCat("block record truncated: ", size, " bytes, header says ", want));
  }
  if (size > want) {
    return absl::InvalidArgumentError(absl::StrCat("block record oversized: ", size, " bytes, header says ", want));
  }
  return h;
}

absl::StatusOr<BlockView> ParseBlock(std::string_view record, const LatentLayout* expected, CrcCheck crc_check) {
  KVTIER_ASSIGN_OR_RETURN(const BlockHeader h, ParseBlockHeader(record, record.size()));
  const size_t want = h.RecordBytes();
  const uint32_t stored_crc = Load<uint32_t>(record, want - kBlockTrailerBytes);
  const uint32_t crc = crc_check == CrcCheck::kCheck ? Crc32c(record.data(), want - kBlockTrailerBytes) : stored_crc;
  if (crc != stored_crc) {
    return absl::DataLossError(absl::StrCat("block checksum mismatch: stored ", absl::Hex(stored_crc, absl::kZeroPad8),
                                            ", computed ", absl::Hex(crc, absl::kZeroPad8)));
  }
  const std::string_view payloads = record.substr(h.HeaderBytes(), h.PayloadBytes());
  if (expected != nullptr) KVTIER_RETURN_IF_ERROR(CheckAgainstLayout(h, *expected, Boundary(h, payloads)));
  return BlockView{h, payloads};
}

std::string EncodeBlockHeader(const BlockHeader& h) {
  std::string b(h.HeaderBytes(), '\0');
  std::memcpy(b.data(), kBlockMagic, sizeof kBlockMagic);
  Store<uint16_t>(b.data(), 4, static_cast<uint16_t>(h.format_version));
  Store<uint8_t>(b.data(), 6, static_cast<uint8_t>(h.codec));
  Store<uint8_t>(b.data(), 7, h.format_version == kV4BlockFormatVersion ? static_cast<uint8_t>(h.kind) : 0);
  Store<uint64_t>(b.data(), 8, h.layout_id);
  Store<uint32_t>(b.data(), 16, h.token_count);
  Store<uint16_t>(b.data(), 20, static_cast<uint16_t>(h.layer_begin));
  Store<uint16_t>(b.data(), 22, static_cast<uint16_t>(h.layer_count));
  Store<uint16_t>(b.data(), 24, static_cast<uint16_t>(h.latent_dim));
  Store<uint16_t>(b.data(), 26, static_cast<uint16_t>(h.rope_dim));
  Store<uint32_t>(b.data(), 28, h.format_version == kV4BlockFormatVersion ? h.payload_bytes : h.layer_payload_bytes);
  if (h.format_version == kIndexedBlockFormatVersion) {
    Store<uint16_t>(b.data(), 32, static_cast<uint16_t>(h.indexer_dim));
    Store<uint8_t>(b.data(), 34, static_cast<uint8_t>(h.indexer_encoding));
    Store<uint32_t>(b.data(), 36, h.indexer_part_bytes);
  }
  return b;
}

absl::StatusOr<std::string> SerializeBlock(const BlockHeader& h, std::string_view payloads) {
  if (h.format_version < kBlockFormatVersion || h.format_version > kV4BlockFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write block format version ", h.format_version));
  }
  KVTIER_RETURN_IF_ERROR(CheckHeaderFields(h));
  const size_t want = h.PayloadBytes();
  if (payloads.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("block payloads are ", payloads.size(), " bytes, header needs ", want));
  }
  std::string record = EncodeBlockHeader(h);
  record.reserve(h.RecordBytes());
  record.append(payloads);
  record.resize(h.RecordBytes());
  const size_t crc_at = record.size() - kBlockTrailerBytes;
  Store<uint32_t>(record.data(), crc_at, Crc32c(record.data(), crc_at));
  return record;
}

absl::StatusOr<std::string> EncodeBlock(const LatentLayout& layout, uint32_t layer_begin, uint32_t layer_count,
                                        std::span<const float> latents, std::span<const uint8_t> indexer_parts) {
  KVTIER_RETURN_IF_ERROR(ValidateLayout(layout));
  if (layer_count < 1 || layer_begin + layer_count > layout.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", layer_begin, ", ", layer_begin + layer_count,
                                                   ") not within the ", layout.num_layers, " of the layout"));
  }
  const kernels::BlockShape shape = layout.LayerShape();
  if (latents.size() != size_t{layer_count} * shape.values()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", layer_count * shape.values(), " latent values, got ", latents.size()));
  }
  const size_t indexer_bytes = layout.IndexerPartBytes();
  if (indexer_parts.size() != size_t{layer_count} * indexer_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", size_t{layer_count} * indexer_bytes,
                                                   " bytes of indexer keys, got ", indexer_parts.size()));
  }
  const size_t latent_bytes = layout.LatentPartBytes(), layer_bytes = layout.LayerPayloadBytes();
  std::string payloads(size_t{layer_count} * layer_bytes, '\0');
  for (uint32_t i = 0; i < layer_count; ++i) {
    uint8_t* layer = reinterpret_cast<uint8_t*>(payloads.data()) + i * layer_bytes;
    kernels::Status s = kernels::Quantize(layout.codec, shape, latents.subspan(i * shape.values(), shape.values()),
                                          std::span(layer, latent_bytes));
    if (!s.ok()) {
      return absl::Status(FromKernelStatus(s).code(), absl::StrCat("layer ", layer_begin + i, ": ", s.message()));
    }
    std::copy_n(indexer_parts.data() + i * indexer_bytes, indexer_bytes, layer + latent_bytes);
  }
  return SerializeBlock(HeaderFor(layout, layer_begin, layer_count), payloads);
}

absl::StatusOr<std::string> EncodeV4Record(const LatentLayout& layout, RecordKind kind, std::string_view payload) {
  KVTIER_RETURN_IF_ERROR(ValidateLayout(layout));
  if (!layout.IsV4()) return absl::InvalidArgumentError("a DeepSeek-V4 record needs a V4 layout");
  if (payload.size() > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("a ", payload.size(), "-byte payload does not fit a record"));
  }
  BlockHeader h = HeaderFor(layout, 0, layout.num_layers);
  h.kind = kind;
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  KVTIER_ASSIGN_OR_RETURN(std::string record, SerializeBlock(h, payload));  // its header's own checks
  KVTIER_RETURN_IF_ERROR(CheckAgainstLayout(h, layout, Boundary(h, payload)));
  return record;
}

absl::Status DecodeBlock(const BlockView& block, std::span<float> out) {
  const kernels::BlockShape shape = block.header.LayerShape();
  if (out.size() != size_t{block.header.layer_count} * shape.values()) {
    return absl::InvalidArgumentError(absl::StrCat("output holds ", out.size(), " values, block has ",
                                                   size_t{block.header.layer_count} * shape.values()));
  }
  for (uint32_t i = 0; i < block.header.layer_count; ++i) {
    const std::string_view layer = block.LatentPart(i);
    KVTIER_RETURN_IF_ERROR(FromKernelStatus(
        kernels::Dequantize(block.header.codec, shape,
                            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(layer.data()), layer.size()),
                            out.subspan(i * shape.values(), shape.values()))));
  }
  return absl::OkStatus();
}

void CopyFromPieces(std::span<const std::span<const uint8_t>> pieces, size_t offset, std::span<uint8_t> out) {
  for (const auto& piece : pieces) {
    if (out.empty()) return;
    if (offset >= piece.size()) {
      offset -= piece.size();
      continue;
    }
    const size_t n = std::min(out.size(), piece.size() - offset);
    std::memcpy(out.data(), piece.data() + offset, n);
    out = out.subspan(n);
    offset = 0;
  }
}

absl::StatusOr<BlockHeader> ParseScatteredBlock(std::span<const std::span<const uint8_t>> pieces,
                                                const LatentLayout* expected) {
  size_t size = 0;
  for (const auto& piece : pieces) size += piece.size();
  std::array<uint8_t, kIndexedBlockHeaderBytes> head{};
  const size_t head_bytes = std::min(head.size(), size);
  CopyFromPieces(pieces, 0, std::span(head).first(head_bytes));
  KVTIER_ASSIGN_OR_RETURN(
      const BlockHeader h,
      ParseBlockHeader(std::string_view(reinterpret_cast<const char*>(head.data()), head_bytes), size));
  uint32_t crc = 0;
  size_t left = size - kBlockTrailerBytes;
  for (const auto& piece : pieces) {
    const size_t n = std::min(left, piece.size());
    crc = Crc32cExtend(crc, piece.data(), n);
    left -= n;
  }
  if (const uint32_t stored_crc = TrailerCrc(pieces, size); crc != stored_crc) {
    return absl::DataLossError(absl::StrCat("block checksum mismatch: stored ", absl::Hex(stored_crc, absl::kZeroPad8),
                                            ", computed ", absl::Hex(crc, absl::kZeroPad8)));
  }
  if (expected != nullptr) {
    uint64_t boundary = 0;
    if (h.format_version == kV4BlockFormatVersion && h.kind == RecordKind::kRestorePoint) {
      CopyFromPieces(pieces, h.HeaderBytes(), std::span(reinterpret_cast<uint8_t*>(&boundary), sizeof boundary));
    }
    KVTIER_RETURN_IF_ERROR(CheckAgainstLayout(h, *expected, boundary));
  }
  return h;
}

uint32_t TrailerCrc(std::span<const std::span<const uint8_t>> pieces, size_t size) {
  uint32_t crc = 0;
  CopyFromPieces(pieces, size - kBlockTrailerBytes, std::span(reinterpret_cast<uint8_t*>(&crc), sizeof crc));
  return crc;
}

}  // namespace kvtier::kvblock
