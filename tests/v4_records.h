// DeepSeek-V4 records for the tests of the record format, the store, the
// cache and its clients: a small layout, and payloads and records of
// random bytes (a record does not read its payload, but a restore point's
// boundary).
#ifndef KVTIER_TESTS_V4_RECORDS_H_
#define KVTIER_TESTS_V4_RECORDS_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "kvtier/kernels/v4_entry.h"
#include "load/bench_layout.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/layout.h"

namespace kvtier::testing {

// Two layers, one window-only and one of ratio 16; entries of 128 values
// (64 rotated); blocks of 16 tokens; a window of 16.
inline kvblock::LatentLayout SmallV4Layout() {
  kvblock::LatentLayout l{.model_id = "test-v4",
                          .num_layers = 2,
                          .kv_lora_rank = 128,
                          .rope_dim = 64,
                          .tokens_per_block = 16,
                          .codec = kernels::Codec::kFp8,
                          .block_format_version = kvblock::kV4BlockFormatVersion};
  l.compress_ratios = {0, 16};
  l.sliding_window = 16;
  return l;
}

// DeepSeek-V4-Flash's released layout (docs/protocol.md's format 3
// layout vector): 43 layers, blocks of 128 tokens.
inline kvblock::LatentLayout V4FlashLayout() { return load::V4Flash("deepseek-ai/DeepSeek-V4-Flash"); }

// A block's payload, or the restore point's after `boundary` tokens (its
// first 8 bytes), of `layout`'s size.
inline std::string RandomV4Payload(const kvblock::LatentLayout& layout, kvblock::RecordKind kind, uint64_t boundary,
                                   std::mt19937_64& rng) {
  const bool block = kind == kvblock::RecordKind::kBlock;
  std::string payload(block ? kernels::V4BlockBytes(layout.V4Parts(), layout.tokens_per_block)
                            : kernels::V4RestorePointBytes(layout.V4Parts(), boundary),
                      '\0');
  for (char& c : payload) c = static_cast<char>(rng());
  if (!block) std::memcpy(payload.data(), &boundary, sizeof boundary);
  return payload;
}

// The record holding such a payload (empty if the layout refuses it).
inline std::string RandomV4Record(const kvblock::LatentLayout& layout, kvblock::RecordKind kind, uint64_t boundary,
                                  std::mt19937_64& rng) {
  absl::StatusOr<std::string> record =
      kvblock::EncodeV4Record(layout, kind, RandomV4Payload(layout, kind, boundary, rng));
  return record.ok() ? *std::move(record) : std::string();
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_V4_RECORDS_H_
