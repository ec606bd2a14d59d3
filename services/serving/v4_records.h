// A DeepSeek-V4 sequence (runtime::SequenceCache's v4 state) to and from the
// format 3 records the cache stores (v4_cache_parts.h's parts, each in one
// record with its CRC): a block's, or the restore point at a boundary,
// which the cache keeps under kvblock::RestorePointKey of the block before
// it.
#ifndef KVTIER_SERVICES_SERVING_V4_RECORDS_H_
#define KVTIER_SERVICES_SERVING_V4_RECORDS_H_

#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "services/cache/client/shared_record.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/layout.h"
#include "services/runtime/model.h"

namespace kvtier::serving {

// Block `block` of `cache` (which holds at least its tokens) as a record of
// `layout`.
absl::StatusOr<std::string> V4BlockRecord(const runtime::ModelConfig& config, const kvblock::LatentLayout& layout,
                                          const runtime::SequenceCache& cache, size_t block);

// The restore point at `cache`'s length, which must be a block boundary, as
// a record of `layout`.
absl::StatusOr<std::string> V4RestorePointRecord(const runtime::ModelConfig& config,
                                                 const kvblock::LatentLayout& layout,
                                                 const runtime::SequenceCache& cache);

// OK when `record` is a whole record of `layout` holding `kind` (its CRC
// checked); else the parser's error, or INVALID_ARGUMENT for another kind.
absl::Status CheckV4Record(std::string_view record, const kvblock::LatentLayout& layout, kvblock::RecordKind kind);

// Makes the fresh `cache` hold the sequence that `blocks` (its first ones,
// in order) and the restore point after the last of them describe. Records
// are parsed without trust (their CRC too, unless `crc_check` says that was
// done where they landed): INVALID_ARGUMENT (or the parser's code) naming
// the record at fault, leaving `cache` as it was.
absl::Status RestoreV4Records(const runtime::ModelConfig& config, const kvblock::LatentLayout& layout,
                              std::span<const cache::SharedRecord> blocks, const cache::SharedRecord& restore_point,
                              kvblock::CrcCheck crc_check, runtime::SequenceCache& cache);

}  // namespace kvtier::serving

#endif  // KVTIER_SERVICES_SERVING_V4_RECORDS_H_
