// The block record parser, on bytes from any client (a Put's records) or
// from a cache (a Get's): ParseBlock, ParseBlockHeader and
// ParseScatteredBlock agree on every record (the same status code, the
// same header), a record they accept is exactly its header, payload and
// trailer and serializes back to itself, and its latents decode. Input: a
// flags byte (bit 0: reseal the trailer's CRC32C first, so that changed
// headers reach the checks past it; bit 1: CrcCheck::kCheckedBefore; bits
// 2-4: the layout expected, none or one of Layouts()), the length of the
// pieces a scattered copy is cut into (1-64 bytes), then the record.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "services/kvblock/block_format.h"
#include "services/kvblock/crc32c.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/layouts.h"
#include "tests/v4_records.h"

namespace kvtier::fuzz {
namespace {

using kvblock::LatentLayout;

std::string Flags(bool reseal, size_t layout) { return {static_cast<char>((reseal ? 1 : 0) | layout << 2), 16}; }

}  // namespace

std::vector<std::string> Seeds() {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<std::string> seeds;
  const std::vector<LatentLayout> layouts = Layouts();
  for (size_t i = 0; i < layouts.size(); ++i) {
    const LatentLayout& l = layouts[i];
    std::string record;
    if (l.IsV4()) {
      record = testing::RandomV4Record(l, kvblock::RecordKind::kBlock, 0, rng);
    } else {
      std::vector<float> latents(size_t{2} * l.LayerShape().values());
      for (float& x : latents) x = normal(rng);
      std::vector<uint8_t> keys(2 * l.IndexerPartBytes(), 0x38);  // fp8 1.0
      for (size_t at = 0; at < keys.size(); at += l.IndexerPartBytes()) {
        const size_t scales = at + size_t{l.tokens_per_block} * l.indexer_dim;
        for (size_t s = scales; s < at + l.IndexerPartBytes(); s += sizeof(float)) {
          const float one = 1.0f;
          std::memcpy(&keys[s], &one, sizeof one);
        }
      }
      record = *kvblock::EncodeBlock(l, 1, 2, latents, keys);
    }
    seeds.push_back(Flags(true, i + 1) + record);
    seeds.push_back(Flags(true, 0) + record);
  }
  return seeds;
}

}  // namespace kvtier::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;
  using namespace kvtier::kvblock;
  static const std::vector<LatentLayout> layouts = fuzz::Layouts();
  if (size < 2) return 0;
  const bool reseal = data[0] & 1;
  const CrcCheck crc_check = data[0] & 2 ? CrcCheck::kCheckedBefore : CrcCheck::kCheck;
  const size_t choice = (data[0] >> 2) % 8;
  const LatentLayout* expected = choice >= 1 && choice <= layouts.size() ? &layouts[choice - 1] : nullptr;
  const size_t piece = 1 + data[1] % 64;
  std::string record(reinterpret_cast<const char*>(data) + 2, size - 2);
  if (reseal && record.size() >= kBlockTrailerBytes) {
    const uint32_t crc = Crc32c(record.data(), record.size() - kBlockTrailerBytes);
    std::memcpy(record.data() + record.size() - kBlockTrailerBytes, &crc, sizeof crc);
  }

  const absl::StatusOr<BlockView> view = ParseBlock(record, expected, crc_check);
  const absl::StatusOr<BlockView> checked = ParseBlock(record, expected);
  // kCheckedBefore skips the CRC check (made before the layout's) and
  // nothing else.
  const bool crc_failed = checked.status().code() == absl::StatusCode::kDataLoss;
  KVTIER_FUZZ_CHECK(view.ok() ? checked.ok() || crc_failed
                              : checked.status().code() == view.status().code() || crc_failed);

  std::vector<std::span<const uint8_t>> pieces;
  const auto* bytes = reinterpret_cast<const uint8_t*>(record.data());
  for (size_t at = 0; at < record.size(); at += piece)
    pieces.emplace_back(bytes + at, std::min(piece, record.size() - at));
  const absl::StatusOr<BlockHeader> scattered = ParseScatteredBlock(pieces, expected);
  KVTIER_FUZZ_CHECK(scattered.status().code() == checked.status().code());

  const absl::StatusOr<BlockHeader> head =
      ParseBlockHeader(std::string_view(record).substr(0, kIndexedBlockHeaderBytes), record.size());
  if (!view.ok()) return 0;
  KVTIER_FUZZ_CHECK(head.ok());
  const BlockHeader& header = view->header;
  KVTIER_FUZZ_CHECK(EncodeBlockHeader(*head) == EncodeBlockHeader(header));
  if (scattered.ok()) KVTIER_FUZZ_CHECK(EncodeBlockHeader(*scattered) == EncodeBlockHeader(header));
  KVTIER_FUZZ_CHECK(header.RecordBytes() == record.size());
  KVTIER_FUZZ_CHECK(view->payloads.size() == header.PayloadBytes());
  KVTIER_FUZZ_CHECK(view->payloads.data() == record.data() + header.HeaderBytes());
  if (header.format_version == kV4BlockFormatVersion) return 0;
  // Formats 1 and 2: the record is its header and payloads, sealed.
  const absl::StatusOr<std::string> again = SerializeBlock(header, view->payloads);
  KVTIER_FUZZ_CHECK(again.ok());
  KVTIER_FUZZ_CHECK(*again == record || crc_check == CrcCheck::kCheckedBefore);
  const size_t values = size_t{header.layer_count} * header.LayerShape().values();
  if (values > (size_t{1} << 22)) return 0;  // a header may claim a large block honestly
  std::vector<float> latents(values);
  KVTIER_FUZZ_CHECK(DecodeBlock(*view, latents).ok());
  return 0;
}
