// What a cache keeps of a DeepSeek-V4 sequence, cut at block boundaries
// (tokens_per_block a multiple of every layer's compress ratio, so that at
// a boundary every group has closed):
//
// - A block holds, layer after layer, the compressed entries its tokens
//   closed (tokens_per_block / ratio of them) and on CSA layers their
//   indexer keys after them; window-only layers hold nothing. Every longer
//   prefix needs these, so they are paid for once per block.
// - A restore point at a boundary holds the boundary (tokens before it,
//   8 bytes little-endian), then, layer after layer, the window's
//   entries of the tokens before it (the last sliding_window, oldest first)
//   and on layers whose groups overlap (ratio 4) each compressor's last
//   group's first-half rows (kv, then score; float32): what a continuation
//   needs that the blocks do not hold, paid for only where a restore may
//   end.
//
// Entries and keys are in their byte formats (kernels/v4_entry.h), which
// hold the model's own rounding exactly: blocks and a restore point give
// back the state they were cut from, bit for bit, so a continuation from
// them equals an uninterrupted run.
#ifndef KVTIER_SERVICES_RUNTIME_V4_CACHE_PARTS_H_
#define KVTIER_SERVICES_RUNTIME_V4_CACHE_PARTS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "services/runtime/model.h"
#include "services/runtime/model_config.h"

namespace kvtier::runtime {

// INVALID_ARGUMENT unless `config` is a V4 one and tokens_per_block a
// positive multiple of every layer's compress ratio.
absl::Status CheckV4BlockTokens(const ModelConfig& config, uint32_t tokens_per_block);

size_t V4BlockBytes(const ModelConfig& config, uint32_t tokens_per_block);
// A restore point after `boundary` tokens.
size_t V4RestorePointBytes(const ModelConfig& config, int64_t boundary);

// Block `block` of a sequence that holds at least its tokens.
absl::StatusOr<std::vector<uint8_t>> EncodeV4Block(const ModelConfig& config, const SequenceCache& cache, size_t block,
                                                   uint32_t tokens_per_block);
// The restore point at the cache's length, which must be a boundary.
absl::StatusOr<std::vector<uint8_t>> EncodeV4RestorePoint(const ModelConfig& config, const SequenceCache& cache,
                                                          uint32_t tokens_per_block);

// A fresh cache (Model::NewCache) made to hold the sequence that `blocks`
// (its first blocks, in order) and the restore point after the last of
// them describe. INVALID_ARGUMENT, leaving the cache as it was, for parts
// of the wrong size or with values the formats cannot hold (NaN codes).
absl::Status RestoreV4(const ModelConfig& config, std::span<const std::span<const uint8_t>> blocks,
                       std::span<const uint8_t> restore_point, uint32_t tokens_per_block, SequenceCache& cache);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_V4_CACHE_PARTS_H_
