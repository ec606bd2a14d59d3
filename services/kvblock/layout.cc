#include "services/kvblock/layout.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
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
    case IndexerEncoding::kMxfp4:
      return size_t{tokens} * kernels::V4IndexKeyBytes(dim);
    case IndexerEncoding::kNone:
      break;
  }
  return 0;
}

uint32_t FormatVersionFor(IndexerEncoding encoding) {
  return encoding == IndexerEncoding::kNone ? kBlockFormatVersion : kIndexedBlockFormatVersion;
}

namespace {

// The fields only DeepSeek-V4's layouts have, and what they imply.
absl::Status ValidateV4Fields(const LatentLayout& l) {
  if (!l.IsV4()) {
    if (l.sliding_window != 0 || l.indexer_encoding == IndexerEncoding::kMxfp4) {
      return absl::InvalidArgumentError(
          "layout.sliding_window and MXFP4 indexer keys belong to DeepSeek-V4 layouts (compress_ratios set)");
    }
    return absl::OkStatus();
  }
  if (l.block_format_version != kV4BlockFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("layout.block_format_version ", l.block_format_version,
                                                   ": DeepSeek-V4 layouts (compress_ratios set) are format ",
                                                   kV4BlockFormatVersion));
  }
  if (l.compress_ratios.size() != l.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layout.compress_ratios has ", l.compress_ratios.size(),
                                                   " entries for ", l.num_layers, " layers"));
  }
  bool csa = false;
  for (uint32_t r : l.compress_ratios) {
    if (r > l.tokens_per_block || (r > 0 && l.tokens_per_block % r != 0)) {
      return absl::InvalidArgumentError(absl::StrCat("layout.compress_ratios: ", r,
                                                     " does not divide tokens_per_block ", l.tokens_per_block,
                                                     " (a block must close every group)"));
    }
    csa = csa || r == 4;
  }
  if (l.sliding_window < 1 || l.sliding_window > kernels::kMaxBlockTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.sliding_window ", l.sliding_window, " outside 1..", kernels::kMaxBlockTokens));
  }
  if (l.codec != kernels::Codec::kFp8 || l.rope_dim >= l.kv_lora_rank || (l.kv_lora_rank - l.rope_dim) % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout: DeepSeek-V4 entries are the model's FP8 (codec fp8) of head_dim ", l.kv_lora_rank,
                     " with ", l.rope_dim, " rotated dims; their other dims must be whole blocks of 64"));
  }
  if (csa != (l.indexer_encoding == IndexerEncoding::kMxfp4) || (csa && l.indexer_dim % 32 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.indexer_encoding ", static_cast<int>(l.indexer_encoding), " of dim ", l.indexer_dim,
                     ": a DeepSeek-V4 layout with ratio-4 layers keeps MXFP4 keys (encoding 2, dim a multiple of "
                     "32), one without them none"));
  }
  return absl::OkStatus();
}

}  // namespace

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
  if (l.indexer_encoding != IndexerEncoding::kNone && l.indexer_encoding != IndexerEncoding::kFp8 &&
      l.indexer_encoding != IndexerEncoding::kMxfp4) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.indexer_encoding ", static_cast<int>(l.indexer_encoding), " is not a known encoding"));
  }
  if ((l.indexer_encoding == IndexerEncoding::kNone) != (l.indexer_dim == 0) || l.indexer_dim > kMaxIndexerDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout.indexer_dim ", l.indexer_dim, " with indexer_encoding ", static_cast<int>(l.indexer_encoding),
        ": both unset (no indexer keys) or both set, the dim at most ", kMaxIndexerDim));
  }
  KVTIER_RETURN_IF_ERROR(ValidateV4Fields(l));
  if (!l.IsV4() && l.block_format_version != FormatVersionFor(l.indexer_encoding)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout.block_format_version ", l.block_format_version, " is not supported for this layout: blocks ",
        l.indexer_dim == 0 ? "without" : "with", " indexer keys are format ", FormatVersionFor(l.indexer_encoding),
        " (this build reads ", kBlockFormatVersion, " to ", kV4BlockFormatVersion, ")"));
  }
  if (kernels::Status s = kernels::ValidateShape(l.LayerShape()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("layout tokens_per_block/kv_lora_rank/rope_dim: ", s.message()));
  }
  if (l.kv_lora_rank > 0xffff || l.rope_dim > 0xffff) {
    return absl::InvalidArgumentError("layout dims must fit 16 bits");
  }
  if (l.IsV4()) {
    // A record's header holds its payload's size in 32 bits; the largest
    // restore point is the one whose window is full.
    const size_t block = kernels::V4BlockBytes(l.V4Parts(), l.tokens_per_block);
    const size_t point = kernels::V4RestorePointBytes(l.V4Parts(), l.sliding_window);
    if (std::max(block, point) > UINT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("layout: a DeepSeek-V4 block of ", block,
                                                     " bytes or restore point of up to ", point,
                                                     " bytes does not fit a record (at most 4 GiB - 1)"));
    }
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
  if (l.IsV4()) {  // and format 2 ones theirs
    AppendU32(canonical, static_cast<uint32_t>(l.compress_ratios.size()));
    for (uint32_t r : l.compress_ratios) AppendU32(canonical, r);
    AppendU32(canonical, l.sliding_window);
  }
  // Blocks of one layout arrive by the thousand, each checked against it:
  // a thread keeps the last id it hashed.
  thread_local std::string last_canonical;
  thread_local uint64_t last_id = 0;
  if (canonical == last_canonical) return last_id;
  const Sha256Digest digest = Sha256({canonical});
  uint64_t id;
  std::memcpy(&id, digest.data(), sizeof id);
  last_canonical = std::move(canonical);
  last_id = id;
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
  if (static_cast<uint32_t>(p.compress_ratios_size()) > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat("layout.compress_ratios has ", p.compress_ratios_size(),
                                                   " entries, more than ", kMaxLayers, " layers"));
  }
  l.compress_ratios.assign(p.compress_ratios().begin(), p.compress_ratios().end());
  l.sliding_window = p.sliding_window();
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
  for (uint32_t r : l.compress_ratios) p.add_compress_ratios(r);
  p.set_sliding_window(l.sliding_window);
  p.set_layout_id(LayoutId(l));
  return p;
}

}  // namespace kvtier::kvblock
