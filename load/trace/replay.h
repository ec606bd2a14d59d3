// Replays a request trace against a real kvtier-cache as prefill nodes
// would use it: for each request in trace order, Match the longest cached
// prefix of its blocks, Get that prefix, Put the rest. What it measures is
// the cache's prefix hit rate at its capacity, against the trace's ceiling
// (what an unbounded cache would hit).
#ifndef KVTIER_LOAD_TRACE_REPLAY_H_
#define KVTIER_LOAD_TRACE_REPLAY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "load/trace/trace.h"
#include "services/cache/client/cache_client.h"
#include "services/kvblock/layout.h"

namespace kvtier::load {

struct ReplayResult {
  uint64_t requests = 0;
  uint64_t prompt_tokens = 0;
  uint64_t hit_tokens = 0;      // prompt tokens whose blocks came from the cache
  uint64_t ceiling_tokens = 0;  // what an unbounded cache would have served
  uint64_t bytes_put = 0;       // record bytes sent by Put
  uint64_t written_back = 0;    // blocks an answer filled, stored as decode writes them back
  uint64_t bytes_got = 0;       // record bytes read by Get
  v1::StatsResponse stats;      // the cache's, after the last request

  double HitRate() const { return prompt_tokens ? double(hit_tokens) / prompt_tokens : 0; }
  double CeilingRate() const { return prompt_tokens ? double(ceiling_tokens) / prompt_tokens : 0; }
};

// `layout` says what the blocks are (one record of all its layers each:
// the cache sees the bytes a prefill node would store); `mapping.layout_id`
// must be its id. With `time_scale` > 0, request i is sent no earlier than
// its timestamp / time_scale after the first; 0: as fast as possible. A
// hit counts only blocks Get really returned, in prefix order. With
// `write_back`, the blocks a request's answer fills (whole blocks of prompt
// and output past the prompt's) are stored after it, as a decode worker
// writes them back: new content, which the trace's later ids never name,
// so they only take room. A DeepSeek-V4 layout's requests are served as
// kvtier-prefill serves them: the prefix restorable from a stored point
// (docs/protocol.md, "Block keys"), the new blocks and the points at the
// prompt's last boundary (and every mapping.restore_every blocks) stored;
// no write-back.
absl::StatusOr<ReplayResult> Replay(const std::vector<TraceRequest>& requests, cache::CacheClient& cache,
                                    const kvblock::LatentLayout& layout, const BlockMapping& mapping,
                                    double time_scale = 0, bool write_back = false);

}  // namespace kvtier::load

#endif  // KVTIER_LOAD_TRACE_REPLAY_H_
