#include "load/trace/replay.h"

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvtier/kernels/v4_entry.h"
#include "services/cache/client/put_wire.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/block_key.h"

namespace kvtier::load {

absl::StatusOr<ReplayResult> Replay(const std::vector<TraceRequest>& requests, cache::CacheClient& cache,
                                    const kvblock::LatentLayout& layout, const BlockMapping& mapping, double time_scale,
                                    bool write_back) {
  if (mapping.layout_id != kvblock::LayoutId(layout)) {
    return absl::InvalidArgumentError("the mapping's layout id is not the layout's");
  }
  if (write_back && layout.IsV4()) {
    return absl::UnimplementedError("write-back is not modelled for DeepSeek-V4 layouts");
  }
  // Every block's record: the cache keeps bytes, not meaning, so one
  // record of the layout's size serves them all (a V4 restore point's
  // names its boundary).
  absl::StatusOr<std::string> record;
  if (layout.IsV4()) {
    record =
        kvblock::EncodeV4Record(layout, kvblock::RecordKind::kBlock,
                                std::string(kernels::V4BlockBytes(layout.V4Parts(), layout.tokens_per_block), '\0'));
  } else {
    std::vector<float> latents(size_t{layout.num_layers} * layout.LayerShape().values(), 0.5f);
    const std::vector<uint8_t> indexer_keys(size_t{layout.num_layers} * layout.IndexerPartBytes());
    record = kvblock::EncodeBlock(layout, 0, layout.num_layers, latents, indexer_keys);
  }
  if (!record.ok()) return record.status();
  const auto restore_point = [&](uint64_t boundary) {
    std::string payload(kernels::V4RestorePointBytes(layout.V4Parts(), boundary), '\0');
    std::memcpy(payload.data(), &boundary, kernels::kV4BoundaryBytes);
    return kvblock::EncodeV4Record(layout, kvblock::RecordKind::kRestorePoint, payload);
  };

  ReplayResult result;
  const std::vector<uint64_t> ceiling =
      layout.IsV4() ? UnboundedRestorableTokens(requests, mapping) : UnboundedHitTokens(requests, mapping);
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
    // V4: only the blocks before the prompt's last boundary, which the
    // cache cuts back to its last restore point.
    const size_t asked = layout.IsV4() ? RestoreBlocks(r, mapping, chain.size()) : chain.size();
    size_t hit = 0;
    if (asked > 0) {
      absl::StatusOr<v1::MatchResponse> match =
          cache.Match(mapping.ns, layout, std::vector<kvblock::BlockHash>(chain.begin(), chain.begin() + asked));
      if (!match.ok()) return match.status();
      hit = std::min<size_t>(match->matched_blocks(), asked);
    }
    if (hit > 0) {
      std::vector<kvblock::BlockHash> keys(chain.begin(), chain.begin() + hit);
      if (layout.IsV4()) keys.push_back(kvblock::RestorePointKey(keys.back()));
      absl::StatusOr<std::vector<cache::FetchedBlock>> got = cache.Get(mapping.ns, layout, keys);
      if (!got.ok()) return got.status();
      size_t found = 0;
      while (found < got->size() && (*got)[found].status.ok()) result.bytes_got += (*got)[found++].record.size();
      // Evicted between Match and Get: computed again (V4: all of it, when
      // a block or the point is gone).
      hit = layout.IsV4() ? (found == keys.size() ? hit : 0) : found;
    }
    result.hit_tokens += hit * mapping.tokens_per_block;
    std::vector<cache::BlockSlices> rest;
    for (size_t b = hit; b < chain.size(); ++b) rest.push_back({chain[b], {*record}});
    for (size_t m :
         layout.IsV4() ? kvblock::NewRestorePoints(hit, asked, mapping.restore_every) : std::vector<size_t>{}) {
      absl::StatusOr<std::string> point = restore_point(m * mapping.tokens_per_block);
      if (!point.ok()) return point.status();
      rest.push_back({kvblock::RestorePointKey(chain[m - 1]), {*std::move(point)}});
    }
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
      absl::StatusOr<v1::PutResponse> put =
          cache.Put(mapping.ns, layout, rest, kvtier::cache::IsColdStart(hit, chain.size()));
      if (!put.ok()) return put.status();
      for (const cache::BlockSlices& b : rest) result.bytes_put += b.records[0].size();
    }
  }
  absl::StatusOr<v1::StatsResponse> stats = cache.Stats();
  if (!stats.ok()) return stats.status();
  result.stats = *std::move(stats);
  return result;
}

}  // namespace kvtier::load
