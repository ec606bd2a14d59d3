// Request traces in the format of Mooncake's production trace release
// (FAST'25): JSON lines, one request a line,
//   {"timestamp": ms, "input_length": tokens, "output_length": tokens,
//    "hash_ids": [ids]}
// with one id per 512-token block of the prompt, chained so that equal
// prefixes share ids. Here: reading them, and turning a request's ids into
// the kvtier block keys a prefill node would store for it.
#ifndef KVTIER_LOAD_TRACE_TRACE_H_
#define KVTIER_LOAD_TRACE_TRACE_H_

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/kvblock/block_key.h"

namespace kvtier::load {

struct TraceRequest {
  int64_t timestamp_ms = 0;
  uint64_t input_length = 0;
  uint64_t output_length = 0;
  std::vector<uint64_t> hash_ids;
};

// Every line of `in` (blank lines skipped), at most `limit` (0: all).
// INVALID_ARGUMENT naming the line for one that is not such a request.
absl::StatusOr<std::vector<TraceRequest>> ReadTrace(std::istream& in, size_t limit = 0);

// How trace blocks map to kvtier blocks.
struct BlockMapping {
  uint32_t trace_block_tokens = 512;  // the trace's block: one hash id
  uint32_t tokens_per_block = 64;     // kvtier's block; divides trace_block_tokens
  uint64_t layout_id = 0;
  std::string ns = "trace";
  // DeepSeek-V4: besides the one at a prompt's last boundary, a restore
  // point after every block count that is a multiple of this (0: none),
  // as kvtier-prefill --restore-every stores them.
  uint32_t restore_every = 0;
};

// The keys of the whole kvtier blocks of `request`'s prompt, in order: each
// trace block gives trace_block_tokens / tokens_per_block of them, a chain
// built from the trace ids (equal trace prefixes give equal keys); a
// prompt's last, partial block is none (a prefill node stores whole blocks
// only), and ids beyond input_length are ignored.
std::vector<kvblock::BlockHash> RequestBlocks(const TraceRequest& request, const BlockMapping& mapping);

// Prompt tokens an unbounded cache would serve from its prefix for each
// request in turn: the trace's ceiling (every request's blocks are stored
// after it is served).
std::vector<uint64_t> UnboundedHitTokens(const std::vector<TraceRequest>& requests, const BlockMapping& mapping);

// A DeepSeek-V4 request's blocks that a continuation restores from: those
// before the last block boundary ahead of its prompt's last token, where a
// prefill node stores the restore point.
size_t RestoreBlocks(const TraceRequest& request, const BlockMapping& mapping, size_t chain_size);

// The ceiling for DeepSeek-V4, whose prefix is restored only where a
// restore point is stored: each request stores its blocks and its
// kvblock::NewRestorePoints, and is served the longest prefix of its RestoreBlocks
// ending at a stored point.
std::vector<uint64_t> UnboundedRestorableTokens(const std::vector<TraceRequest>& requests, const BlockMapping& mapping);

}  // namespace kvtier::load

#endif  // KVTIER_LOAD_TRACE_TRACE_H_
