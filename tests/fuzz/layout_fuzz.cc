// LayoutFromProto, on the layout every RPC carries from any client: a
// layout it accepts goes back to the same proto and comes back the same,
// its block headers hold its sizes without truncation, and a record of it
// (a whole block; for DeepSeek-V4 also a restore point) parses against it,
// where such a record is small enough to make here. Input: a
// kvtier.v1.LatentLayout in wire form.
#include <algorithm>
#include <string>
#include <vector>

#include "services/kvblock/block_format.h"
#include "services/kvblock/layout.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/layouts.h"

namespace kvtier::fuzz {

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  for (const kvblock::LatentLayout& l : Layouts()) seeds.push_back(kvblock::LayoutToProto(l).SerializeAsString());
  seeds.push_back(kvblock::LayoutToProto(testing::V4FlashLayout()).SerializeAsString());
  // The largest each kind allows: every field at its limit.
  kvblock::LatentLayout v2{.model_id = std::string(kvblock::kMaxModelIdBytes, 'm'),
                           .num_layers = kvblock::kMaxLayers,
                           .kv_lora_rank = kernels::kMaxLatentDim,
                           .rope_dim = kernels::kMaxLatentDim,
                           .tokens_per_block = kernels::kMaxBlockTokens,
                           .codec = kernels::Codec::kBf16,
                           .block_format_version = kvblock::kIndexedBlockFormatVersion,
                           .indexer_dim = kvblock::kMaxIndexerDim,
                           .indexer_encoding = kvblock::IndexerEncoding::kFp8};
  seeds.push_back(kvblock::LayoutToProto(v2).SerializeAsString());
  kvblock::LatentLayout v4 = testing::SmallV4Layout();
  v4.num_layers = kvblock::kMaxLayers;
  v4.kv_lora_rank = kernels::kMaxLatentDim;
  v4.tokens_per_block = kernels::kMaxBlockTokens;
  v4.compress_ratios.assign(kvblock::kMaxLayers, 1);
  v4.sliding_window = kernels::kMaxBlockTokens;
  seeds.push_back(kvblock::LayoutToProto(v4).SerializeAsString());
  return seeds;
}

}  // namespace kvtier::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;
  using namespace kvtier::kvblock;
  v1::LatentLayout proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  const absl::StatusOr<LatentLayout> layout = LayoutFromProto(proto);
  if (!layout.ok()) return 0;
  const LatentLayout& l = *layout;
  const absl::StatusOr<LatentLayout> again = LayoutFromProto(LayoutToProto(l));
  KVTIER_FUZZ_CHECK(again.ok() && *again == l);

  constexpr size_t kMakeUpTo = size_t{1} << 20;
  const BlockHeader header = HeaderFor(l, 0, l.num_layers);
  if (l.IsV4()) {
    const size_t block = kernels::V4BlockBytes(l.V4Parts(), l.tokens_per_block);
    KVTIER_FUZZ_CHECK(header.payload_bytes == block);
    const uint64_t boundary = l.tokens_per_block;
    const size_t point = kernels::V4RestorePointBytes(l.V4Parts(), boundary);
    for (const auto& [kind, bytes] :
         {std::pair(RecordKind::kBlock, block), std::pair(RecordKind::kRestorePoint, point)}) {
      if (bytes > kMakeUpTo) continue;
      std::string payload(bytes, '\0');
      if (kind == RecordKind::kRestorePoint)
        payload.replace(0, sizeof boundary, reinterpret_cast<const char*>(&boundary), sizeof boundary);
      const absl::StatusOr<std::string> record = EncodeV4Record(l, kind, payload);
      KVTIER_FUZZ_CHECK(record.ok());
      KVTIER_FUZZ_CHECK(ParseBlock(*record, &l).ok());
    }
    return 0;
  }
  KVTIER_FUZZ_CHECK(header.layer_payload_bytes == l.LayerPayloadBytes());
  KVTIER_FUZZ_CHECK(header.indexer_part_bytes == l.IndexerPartBytes());
  if (l.LayerPayloadBytes() > kMakeUpTo) return 0;
  const std::vector<float> latents(l.LayerShape().values(), 0.5f);
  const std::vector<uint8_t> keys(l.IndexerPartBytes(), 0);  // fp8 zeros, zero scales
  const absl::StatusOr<std::string> record = EncodeBlock(l, l.num_layers - 1, 1, latents, keys);
  KVTIER_FUZZ_CHECK(record.ok());
  KVTIER_FUZZ_CHECK(ParseBlock(*record, &l).ok());
  return 0;
}
