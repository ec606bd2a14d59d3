#include "services/kvblock/layout.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/kvblock/sha256.h"

namespace kvtier::kvblock {
namespace {

void AppendU32(std::string& out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);  // little-endian hosts only (checked in kernels)
  out.append(b, 4);
}

}  // namespace

size_t IndexerPartBytes(IndexerEncoding encoding, uint32_t tokens, uint32_t dim) {
  switch (encoding) {
    case IndexerEncoding::kFp8:
      return size_t{tokens} * (size_t{dim} + sizeof(float));
    case IndexerEncoding::kNone:
      break;
  }
  return 0;
}

uint32_t FormatVersionFor(IndexerEncoding encoding) {
  return encoding == IndexerEncoding::kNone ? kBlockFormatVersion : kIndexedBlockFormatVersion;
}

absl::Status ValidateLayout(const LatentLayout& l) {
  if (l.model_id.empty() || l.model_id.size() > kMaxModelIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.model_id must be 1..", kMaxModelIdBytes, " bytes, got ", l.model_id.size()));
  }
  if (l.num_layers < 1 || l.num_layers > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat("layout.num_layers ", l.num_layers, " outside 1..", kMaxLayers));
  }
  if (!kernels::IsKnownCodec(static_cast<uint8_t>(l.codec))) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.codec ", static_cast<int>(l.codec), " is not a known codec"));
  }
  if (l.indexer_encoding != IndexerEncoding::kNone && l.indexer_encoding != IndexerEncoding::kFp8) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.indexer_encoding ", static_cast<int>(l.indexer_encoding), " is not a known encoding"));
  }
  if ((l.indexer_encoding == IndexerEncoding::kNone) != (l.indexer_dim == 0) || l.indexer_dim > kMaxIndexerDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout.indexer_dim ", l.indexer_dim, " with indexer_encoding ", static_cast<int>(l.indexer_encoding),
        ": both unset (no indexer keys) or both set, the dim at most ", kMaxIndexerDim));
  }
  if (l.block_format_version != FormatVersionFor(l.indexer_encoding)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout.block_format_version ", l.block_format_version, " is not supported for this layout: blocks ",
        l.indexer_dim == 0 ? "without" : "with", " indexer keys are format ", FormatVersionFor(l.indexer_encoding),
        " (this build reads ", kBlockFormatVersion, " and ", kIndexedBlockFormatVersion, ")"));
  }
  if (kernels::Status s = kernels::ValidateShape(l.LayerShape()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("layout tokens_per_block/kv_lora_rank/rope_dim: ", s.message()));
  }
  if (l.kv_lora_rank > 0xffff || l.rope_dim > 0xffff) {
    return absl::InvalidArgumentError("layout dims must fit 16 bits");
  }
  return absl::OkStatus();
}

uint64_t LayoutId(const LatentLayout& l) {
  std::string canonical = "kvtier.layout.v1";
  AppendU32(canonical, static_cast<uint32_t>(l.model_id.size()));
  canonical += l.model_id;
  AppendU32(canonical, l.num_layers);
  AppendU32(canonical, l.kv_lora_rank);
  AppendU32(canonical, l.rope_dim);
  AppendU32(canonical, l.tokens_per_block);
  AppendU32(canonical, static_cast<uint32_t>(l.codec));
  AppendU32(canonical, l.block_format_version);
  if (l.indexer_encoding != IndexerEncoding::kNone) {  // format 1 layouts keep their ids
    AppendU32(canonical, l.indexer_dim);
    AppendU32(canonical, static_cast<uint32_t>(l.indexer_encoding));
  }
  const Sha256Digest digest = Sha256({canonical});
  uint64_t id;
  std::memcpy(&id, digest.data(), sizeof id);
  return id;
}

absl::StatusOr<LatentLayout> LayoutFromProto(const v1::LatentLayout& p) {
  if (p.codec() == v1::KV_CODEC_UNSPECIFIED) {
    return absl::InvalidArgumentError("layout.codec is unspecified");
  }
  if (p.codec() < 0 || p.codec() > 0xff) {
    return absl::InvalidArgumentError(absl::StrCat("layout.codec ", p.codec(), " is unknown"));
  }
  if (p.indexer_encoding() < 0 || p.indexer_encoding() > 0xff) {
    return absl::InvalidArgumentError(absl::StrCat("layout.indexer_encoding ", p.indexer_encoding(), " is unknown"));
  }
  LatentLayout l;
  l.model_id = p.model_id();
  l.num_layers = p.num_layers();
  l.kv_lora_rank = p.kv_lora_rank();
  l.rope_dim = p.rope_dim();
  l.tokens_per_block = p.tokens_per_block();
  l.codec = static_cast<kernels::Codec>(p.codec());
  l.block_format_version = p.block_format_version();
  l.indexer_dim = p.indexer_dim();
  l.indexer_encoding = static_cast<IndexerEncoding>(p.indexer_encoding());
  if (absl::Status s = ValidateLayout(l); !s.ok()) return s;
  if (p.layout_id() != 0 && p.layout_id() != LayoutId(l)) {
    return absl::InvalidArgumentError(absl::StrCat("layout.layout_id ", absl::Hex(p.layout_id()),
                                                   " does not match its fields (computed ", absl::Hex(LayoutId(l)),
                                                   ")"));
  }
  return l;
}

std::string TierName(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_DEVICE:
      return "device";
    case v1::TIER_HOST:
      return "host";
    case v1::TIER_DISK:
      return "disk";
    default:
      return "unspecified";
  }
}

v1::LatentLayout LayoutToProto(const LatentLayout& l) {
  v1::LatentLayout p;
  p.set_model_id(l.model_id);
  p.set_num_layers(l.num_layers);
  p.set_kv_lora_rank(l.kv_lora_rank);
  p.set_rope_dim(l.rope_dim);
  p.set_tokens_per_block(l.tokens_per_block);
  p.set_codec(static_cast<v1::KvCodec>(l.codec));
  p.set_block_format_version(l.block_format_version);
  p.set_indexer_dim(l.indexer_dim);
  p.set_indexer_encoding(static_cast<v1::IndexerEncoding>(l.indexer_encoding));
  p.set_layout_id(LayoutId(l));
  return p;
}

}  // namespace kvtier::kvblock
