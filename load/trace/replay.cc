#include "load/trace/replay.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/kvblock/block_format.h"

namespace kvtier::load {

absl::StatusOr<ReplayResult> Replay(const std::vector<TraceRequest>& requests, cache::CacheClient& cache,
                                    const kvblock::LatentLayout& layout, const BlockMapping& mapping, double time_scale,
                                    bool write_back) {
  if (mapping.layout_id != kvblock::LayoutId(layout)) {
    return absl::InvalidArgumentError("the mapping's layout id is not the layout's");
  }
  // Every block's record: the cache keeps bytes, not meaning, so one
  // record of the layout's size serves them all.
  std::vector<float> latents(size_t{layout.num_layers} * layout.LayerShape().values(), 0.5f);
  const std::vector<uint8_t> indexer_keys(size_t{layout.num_layers} * layout.IndexerPartBytes());
  absl::StatusOr<std::string> record = kvblock::EncodeBlock(layout, 0, layout.num_layers, latents, indexer_keys);
  if (!record.ok()) return record.status();

  ReplayResult result;
  const std::vector<uint64_t> ceiling = UnboundedHitTokens(requests, mapping);
  const absl::Time start = absl::Now();
  for (size_t i = 0; i < requests.size(); ++i) {
    const TraceRequest& r = requests[i];
    if (time_scale > 0) {
      const absl::Time due =
          start + absl::Milliseconds(static_cast<double>(r.timestamp_ms - requests[0].timestamp_ms) / time_scale);
      if (absl::Now() < due) std::this_thread::sleep_for(absl::ToChronoNanoseconds(due - absl::Now()));
    }
    const std::vector<kvblock::BlockHash> chain = RequestBlocks(r, mapping);
    ++result.requests;
    result.prompt_tokens += r.input_length;
    result.ceiling_tokens += ceiling[i];
    size_t hit = 0;
    if (!chain.empty()) {
      absl::StatusOr<v1::MatchResponse> match = cache.Match(mapping.ns, layout, chain);
      if (!match.ok()) return match.status();
      hit = std::min<size_t>(match->matched_blocks(), chain.size());
    }
    if (hit > 0) {
      absl::StatusOr<std::vector<cache::FetchedBlock>> got =
          cache.Get(mapping.ns, layout, std::vector<kvblock::BlockHash>(chain.begin(), chain.begin() + hit));
      if (!got.ok()) return got.status();
      size_t found = 0;
      while (found < got->size() && (*got)[found].status.ok()) result.bytes_got += (*got)[found++].record.size();
      hit = found;  // evicted between Match and Get: computed again
    }
    result.hit_tokens += hit * mapping.tokens_per_block;
    std::vector<cache::BlockSlices> rest;
    for (size_t b = hit; b < chain.size(); ++b) rest.push_back({chain[b], {*record}});
    if (write_back) {
      const uint64_t filled =
          (r.input_length + r.output_length) / mapping.tokens_per_block - r.input_length / mapping.tokens_per_block;
      kvblock::BlockHash parent = chain.empty() ? kvblock::kNoParent : chain.back();
      for (uint32_t k = 0; k < filled; ++k) {
        // Stand-in tokens naming the request and the block of its answer.
        const std::vector<uint32_t> tokens = {0xffffffffu, static_cast<uint32_t>(i), k};
        parent = kvblock::ChainHash(mapping.ns, parent, mapping.layout_id, tokens);
        rest.push_back({parent, {*record}});
      }
      result.written_back += filled;
    }
    if (!rest.empty()) {
      absl::StatusOr<v1::PutResponse> put = cache.Put(mapping.ns, layout, rest);
      if (!put.ok()) return put.status();
      result.bytes_put += rest.size() * record->size();
    }
  }
  absl::StatusOr<v1::StatsResponse> stats = cache.Stats();
  if (!stats.ok()) return stats.status();
  result.stats = *std::move(stats);
  return result;
}

}  // namespace kvtier::load
