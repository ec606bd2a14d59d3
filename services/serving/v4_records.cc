#include "services/serving/v4_records.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
#include "services/runtime/v4_cache_parts.h"

namespace kvtier::serving {
namespace {

std::string_view AsChars(const std::vector<uint8_t>& bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

const char* KindName(kvblock::RecordKind kind) {
  return kind == kvblock::RecordKind::kBlock ? "block" : "restore point";
}

absl::StatusOr<kvblock::BlockView> Parse(std::string_view record, const kvblock::LatentLayout& layout,
                                         kvblock::RecordKind kind, kvblock::CrcCheck crc_check) {
  KVTIER_ASSIGN_OR_RETURN(kvblock::BlockView view, kvblock::ParseBlock(record, &layout, crc_check));
  if (view.header.kind != kind) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", KindName(view.header.kind), " record where a ", KindName(kind), " was expected"));
  }
  return view;
}

// The payload of `record`, a record of `layout` holding `kind` (a view
// into it); `what` names it in errors.
absl::StatusOr<std::span<const uint8_t>> PayloadOf(const cache::SharedRecord& record,
                                                   const kvblock::LatentLayout& layout, kvblock::RecordKind kind,
                                                   kvblock::CrcCheck crc_check, const std::string& what) {
  if (record == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": no record"));
  absl::StatusOr<kvblock::BlockView> view = Parse(*record, layout, kind, crc_check);
  if (!view.ok()) return absl::Status(view.status().code(), absl::StrCat(what, ": ", view.status().message()));
  return std::span(reinterpret_cast<const uint8_t*>(view->payloads.data()), view->payloads.size());
}

}  // namespace

absl::Status CheckV4Record(std::string_view record, const kvblock::LatentLayout& layout, kvblock::RecordKind kind) {
  return Parse(record, layout, kind, kvblock::CrcCheck::kCheck).status();
}

absl::StatusOr<std::string> V4BlockRecord(const runtime::ModelConfig& config, const kvblock::LatentLayout& layout,
                                          const runtime::SequenceCache& cache, size_t block) {
  KVTIER_ASSIGN_OR_RETURN(std::vector<uint8_t> payload,
                          runtime::EncodeV4Block(config, cache, block, layout.tokens_per_block));
  return kvblock::EncodeV4Record(layout, kvblock::RecordKind::kBlock, AsChars(payload));
}

absl::StatusOr<std::string> V4RestorePointRecord(const runtime::ModelConfig& config,
                                                 const kvblock::LatentLayout& layout,
                                                 const runtime::SequenceCache& cache) {
  KVTIER_ASSIGN_OR_RETURN(std::vector<uint8_t> payload,
                          runtime::EncodeV4RestorePoint(config, cache, layout.tokens_per_block));
  return kvblock::EncodeV4Record(layout, kvblock::RecordKind::kRestorePoint, AsChars(payload));
}

absl::Status RestoreV4Records(const runtime::ModelConfig& config, const kvblock::LatentLayout& layout,
                              std::span<const cache::SharedRecord> blocks, const cache::SharedRecord& restore_point,
                              kvblock::CrcCheck crc_check, runtime::SequenceCache& cache) {
  std::vector<std::span<const uint8_t>> payloads;
  for (size_t b = 0; b < blocks.size(); ++b) {
    KVTIER_ASSIGN_OR_RETURN(payloads.emplace_back(), PayloadOf(blocks[b], layout, kvblock::RecordKind::kBlock,
                                                               crc_check, absl::StrCat("block ", b)));
  }
  KVTIER_ASSIGN_OR_RETURN(
      const std::span<const uint8_t> point,
      PayloadOf(restore_point, layout, kvblock::RecordKind::kRestorePoint, crc_check, "the restore point"));
  return runtime::RestoreV4(config, payloads, point, layout.tokens_per_block, cache);
}

}  // namespace kvtier::serving
