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

}  // namespace kvtier::load

#endif  // KVTIER_LOAD_TRACE_TRACE_H_
