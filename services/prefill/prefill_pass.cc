// A Generate request up to its first token: the prompt's cached prefix
// read from the cache shards, the rest prefilled by the model (MLA models
// or DeepSeek-V4, restored from a restore point), its new blocks stored
// for the end tenant, and the DecodeRequest a decode worker continues from.
#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/prefill/prefill_service.h"
#include "services/serving/generated_tokens.h"
#include "services/serving/request_checks.h"
#include "services/serving/sequence_blocks.h"
#include "services/serving/v4_records.h"

namespace kvtier::prefill {

absl::StatusOr<PrefillService::Pass> PrefillService::PrefillMla(const v1::GenerateRequest& r,
                                                                std::span<const uint32_t> prompt,
                                                                const std::vector<kvblock::BlockHash>& chain,
                                                                const std::string& ns, const Caller& caller) {
  const std::string acting_for = caller.ActingFor();
  const uint32_t tpb = layout_.tokens_per_block;
  // The logits after the last prompt token must be computed here, so the
  // block holding it is never taken from the cache.
  const size_t reusable = std::min(chain.size(), (prompt.size() - 1) / tpb);
  Pass p{.cache = model_.NewCache(layout_.codec, tpb), .logits = std::vector<float>(model_.config().vocab_size)};
  if (reusable > 0) {
    const std::vector<kvblock::BlockHash> prefix(chain.begin(), chain.begin() + reusable);
    const size_t matched = shards_.MatchPrefix(ns, layout_, prefix, acting_for);
    const std::vector<kvblock::BlockHash> wanted(prefix.begin(), prefix.begin() + matched);
    // A block gone since Match, corrupt, or on a shard that stopped
    // answering ends the reuse there: the rest is prefilled.
    for (absl::StatusOr<cache::SharedRecord>& record : shards_.Fetch(ns, layout_, wanted, acting_for)) {
      // Fetch checked each record's CRC as it landed.
      absl::Status appended =
          record.ok() ? serving::AppendBlockRecord(*record, layout_, p.cache, kvblock::CrcCheck::kCheckedBefore)
                      : record.status();
      if (!appended.ok()) {
        Log(LogLevel::kWarning, "request",
            absl::StrCat("'", absl::CEscape(r.request_id()), "': cached block ", p.cached_blocks, " of ", matched,
                         " unusable (", appended.message(), "); prefilling from there"));
        break;
      }
      ++p.cached_blocks;
    }
  }
  // Prefill the rest; each layer's newly filled blocks go to their shards
  // as soon as that layer is done (a reader's go to the decode worker
  // inline, and it writes none back).
  cache::ShardedPut put(shards_, ns, layout_, options_.cache_deadline, acting_for,
                        cache::IsColdStart(p.cached_blocks, chain.size()));
  const bool store = caller.MayWrite();
  const runtime::SequenceTokens pass{prompt.subspan(p.cached_blocks * tpb), &p.cache, p.logits};
  KVTIER_RETURN_IF_ERROR(model_.Forward(std::span(&pass, 1), [&](size_t layer) {
    for (size_t b = p.cached_blocks; b < p.cache.blocks[layer].size(); ++b) {
      absl::StatusOr<std::string> slice = serving::BlockRecord(layout_, p.cache, b, static_cast<uint32_t>(layer), 1);
      if (slice.ok() && store) put.Write(chain[b], std::move(*slice));
    }
    put.Flush();  // this layer's slices go now, not with the last layer's
  }));
  p.stored = put.Finish();
  p.decode_needs = chain.size();
  return p;
}

absl::StatusOr<PrefillService::Pass> PrefillService::PrefillV4(const v1::GenerateRequest& r,
                                                               std::span<const uint32_t> prompt,
                                                               const std::vector<kvblock::BlockHash>& chain,
                                                               const std::string& ns, const Caller& caller) {
  const std::string acting_for = caller.ActingFor();
  const runtime::ModelConfig& c = model_.config();
  const uint32_t tpb = layout_.tokens_per_block;
  // The decode worker continues from the restore point at the last
  // boundary before the prompt's last token, and so may the next request.
  const size_t restore_blocks = (prompt.size() - 1) / tpb;
  Pass p{.cache = model_.NewCache(layout_.codec, tpb), .logits = std::vector<float>(c.vocab_size)};
  if (restore_blocks > 0) {
    // The cache cuts the match back to the last block with a restore point.
    const std::vector<kvblock::BlockHash> prefix(chain.begin(), chain.begin() + restore_blocks);
    const size_t matched = shards_.MatchPrefix(ns, layout_, prefix, acting_for);
    if (matched > 0) {
      // The blocks, then the point, which lives beside the last of them.
      std::vector<kvblock::BlockHash> wanted(prefix.begin(), prefix.begin() + matched), shard_keys = wanted;
      wanted.push_back(kvblock::RestorePointKey(wanted.back()));
      shard_keys.push_back(shard_keys.back());
      std::vector<cache::SharedRecord> records;
      absl::Status restored;
      for (absl::StatusOr<cache::SharedRecord>& record : shards_.Fetch(ns, layout_, wanted, acting_for, shard_keys)) {
        if (!record.ok()) {
          restored = record.status();
          break;
        }
        records.push_back(*std::move(record));
      }
      // Fetch checked each record's CRC as it landed.
      if (restored.ok()) {
        restored = serving::RestoreV4Records(c, layout_, std::span(records).first(matched), records.back(),
                                             kvblock::CrcCheck::kCheckedBefore, p.cache);
      }
      if (restored.ok()) {
        p.cached_blocks = matched;
      } else {
        Log(LogLevel::kWarning, "request",
            absl::StrCat("'", absl::CEscape(r.request_id()), "': the cached prefix of ", matched,
                         " blocks is unusable (", restored.message(), "); prefilling it"));
      }
    }
  }
  // In passes that stop where new restore points are taken (the last at
  // the boundary the decode worker continues from), then the rest.
  std::vector<std::pair<size_t, std::string>> points;  // after this many blocks, the record
  for (size_t at = p.cached_blocks;
       size_t m : kvblock::NewRestorePoints(p.cached_blocks, restore_blocks, options_.restore_every)) {
    KVTIER_RETURN_IF_ERROR(model_.Prefill(prompt.subspan(at * tpb, (m - at) * tpb), p.cache, p.logits));
    KVTIER_ASSIGN_OR_RETURN(std::string point, serving::V4RestorePointRecord(c, layout_, p.cache));
    points.emplace_back(m, std::move(point));
    at = m;
  }
  // The decode worker's point: the last new one, or where the cached
  // prefix ended.
  if (!points.empty()) {
    p.restore_point = points.back().second;
  } else if (restore_blocks > 0) {
    KVTIER_ASSIGN_OR_RETURN(p.restore_point, serving::V4RestorePointRecord(c, layout_, p.cache));
  }
  KVTIER_RETURN_IF_ERROR(model_.Prefill(prompt.subspan(restore_blocks * tpb), p.cache, p.logits));
  // The new blocks and points go to their shards (a reader's blocks go to
  // the decode worker inline).
  cache::ShardedPut put(shards_, ns, layout_, options_.cache_deadline, acting_for,
                        cache::IsColdStart(p.cached_blocks, chain.size()));
  if (caller.MayWrite()) {
    for (size_t b = p.cached_blocks; b < chain.size(); ++b) {
      absl::StatusOr<std::string> record = serving::V4BlockRecord(c, layout_, p.cache, b);
      if (record.ok()) put.Write(chain[b], *std::move(record));
    }
    for (auto& [m, point] : points) {
      const kvblock::BlockHash& block = chain[m - 1];
      put.Write(kvblock::RestorePointKey(block), std::move(point), block);  // the point lives on its block's shard
    }
  }
  p.stored = put.Finish();
  p.decode_needs = restore_blocks;
  return p;
}

absl::StatusOr<PrefillService::Prefilled> PrefillService::Prefill(const v1::GenerateRequest& r, const std::string& ns,
                                                                  const Caller& caller) {
  const std::vector<uint32_t> prompt(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  const uint32_t tpb = layout_.tokens_per_block;
  const std::vector<kvblock::BlockHash> chain = kvblock::ComputeBlockChain(ns, kvblock::LayoutId(layout_), tpb, prompt);
  KVTIER_ASSIGN_OR_RETURN(
      Pass p, layout_.IsV4() ? PrefillV4(r, prompt, chain, ns, caller) : PrefillMla(r, prompt, chain, ns, caller));
  Prefilled out;
  out.cached_tokens = static_cast<uint32_t>(p.cached_blocks * tpb);
  v1::DecodeRequest& d = out.decode;
  d.set_request_id(r.request_id());
  d.set_kv_namespace(ns);
  *d.mutable_layout() = kvblock::LayoutToProto(layout_);
  *d.mutable_token_ids() = r.prompt_token_ids();
  for (const kvblock::BlockHash& h : chain) d.add_block_hashes(std::string(kvblock::HashAsBytes(h)));
  // Blocks the cache did not take travel inline (a shard down or slow, or
  // a reader's).
  for (size_t b = p.cached_blocks; b < p.decode_needs; ++b) {
    if (p.stored.contains(chain[b])) continue;
    KVTIER_ASSIGN_OR_RETURN(std::string record, layout_.IsV4()
                                                    ? serving::V4BlockRecord(model_.config(), layout_, p.cache, b)
                                                    : serving::BlockRecord(layout_, p.cache, b, 0, layout_.num_layers));
    v1::InlineBlock& block = *d.add_inline_blocks();
    block.set_block_index(static_cast<uint32_t>(b));
    block.set_data(std::move(record));
    blocks_inline_.Increment();
  }
  if (d.inline_blocks_size() > 0 && caller.MayWrite()) {
    Log(LogLevel::kWarning, "request",
        absl::StrCat("'", absl::CEscape(r.request_id()), "': the cache did not store ", d.inline_blocks_size(), " of ",
                     p.decode_needs - p.cached_blocks, " new blocks; they go to the decode worker inline"));
  }
  d.set_skip_write_back(!caller.MayWrite());
  if (layout_.IsV4()) {
    d.set_restore_point(std::move(p.restore_point));
  } else {
    d.mutable_tail()->set_token_count(static_cast<uint32_t>(prompt.size() % tpb));
    d.mutable_tail()->set_latents(serving::TailBytes(p.cache));
    d.mutable_tail()->set_indexer_keys(serving::TailIndexerKeys(p.cache, layout_));
  }
  *d.mutable_first_token() = serving::ToGeneratedToken(
      0, runtime::Sample(p.logits, serving::ToSampling(r.sampling()), 0, r.limits().top_logprobs()));
  *d.mutable_sampling() = r.sampling();
  *d.mutable_limits() = r.limits();
  return out;
}

}  // namespace kvtier::prefill
