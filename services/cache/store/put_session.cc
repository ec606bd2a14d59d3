// PutSession: a Put stream's blocks, assembled layer by layer in the first
// tier and made visible at once when whole.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
#include "services/cache/store/block_store.h"
#include "services/cache/store/block_store_internal.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/crc32c.h"

namespace kvtier::cache {

struct PutSession::Pending {
  kvblock::BlockHash hash;
  std::vector<uint32_t> pages;
  std::vector<bool> layers;
  uint32_t layers_left = 0;
  // By first layer: the slices' layer counts and payload CRCs, from which
  // the record's CRC is put together without reading the pages back (a
  // GPU's would be copied out again).
  struct Slice {
    uint32_t layers = 0;
    uint32_t payload_crc = 0;
  };
  std::vector<Slice> slices;
};

PutSession::PutSession(BlockStore* store, std::string ns, kvblock::LatentLayout layout, std::string owner)
    : store_(store),
      ns_(std::move(ns)),
      owner_(std::move(owner)),
      layout_(std::move(layout)),
      layout_id_(kvblock::LayoutId(layout_)),
      record_bytes_(kvblock::HeaderFor(layout_, 0, layout_.num_layers).RecordBytes()) {}

PutSession::~PutSession() {
  for (auto& [hash, pending] : pending_) Abandon(*pending);
}

void PutSession::Abandon(Pending& p) {
  absl::MutexLock lock(&store_->mu_);
  store_->GiveRoomLocked(0, {ns_, p.hash, p.pages, record_bytes_}, owner_, /*written=*/false);
  store_->EndPendingLocked(owner_, record_bytes_);
}

absl::Status PutSession::AddSlice(const kvblock::BlockHash& hash, std::string_view record) {
  absl::StatusOr<kvblock::BlockView> slice = kvblock::ParseBlock(record, &layout_);
  if (!slice.ok()) {
    if (slice.status().code() == absl::StatusCode::kDataLoss) {
      absl::MutexLock lock(&store_->mu_);
      ++store_->counters_.arrival_checksum_failures;
    }
    return absl::Status(slice.status().code(),
                        absl::StrCat("slice of block ", kvblock::HashToHex(hash), ": ", slice.status().message()));
  }
  const std::string key(kvblock::HashAsBytes(hash));
  auto it = pending_.find(key);
  if (it == pending_.end()) {
    {
      absl::MutexLock lock(&store_->mu_);
      if (store_->index_.count(BlockStore::Key(ns_, hash)) > 0) {
        // Already stored: this slice and the block's others cost nothing.
        if (deduplicated_.insert(key).second) {
          ++summary_.blocks_deduplicated;
          ++store_->counters_.blocks_deduplicated;
        }
        return absl::OkStatus();
      }
      absl::StatusOr<std::vector<uint32_t>> pages = store_->AllocatePendingLocked(record_bytes_, *this);
      if (!pages.ok()) return pages.status();
      auto pending = std::make_unique<Pending>();
      pending->hash = hash;
      pending->pages = std::move(*pages);
      pending->layers.assign(layout_.num_layers, false);
      pending->layers_left = layout_.num_layers;
      pending->slices.resize(layout_.num_layers);
      it = pending_.emplace(key, std::move(pending)).first;
    }
    // Its room is ours alone now: made ready without the lock.
    store_->tiers_[0]->storage->Prepare(it->second->pages);
  }
  Pending& p = *it->second;
  const kvblock::BlockHeader& h = slice->header;
  for (uint32_t l = h.layer_begin; l < h.layer_begin + h.layer_count; ++l) {
    if (p.layers[l]) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, " of block ", kvblock::HashToHex(hash), " sent twice"));
    }
  }
  const TierStorage& first = *store_->tiers_[0]->storage;
  const RecordRoom room{ns_, hash, p.pages, record_bytes_};
  KVTIER_RETURN_IF_ERROR(
      first.WriteAt(room, h.HeaderBytes() + size_t{h.layer_begin} * h.layer_payload_bytes, slice->payloads));
  for (uint32_t l = h.layer_begin; l < h.layer_begin + h.layer_count; ++l) p.layers[l] = true;
  p.layers_left -= h.layer_count;
  // ParseBlock verified crc(header || payloads), the slice's last 4 bytes;
  // the payloads' own CRC follows from it and the header's.
  uint32_t slice_crc;
  std::memcpy(&slice_crc, record.data() + record.size() - sizeof slice_crc, sizeof slice_crc);
  const uint32_t header_crc = kvblock::Crc32c(record.data(), h.HeaderBytes());
  p.slices[h.layer_begin] = {h.layer_count, kvblock::Crc32cCombine(header_crc, slice_crc, slice->payloads.size())};
  {
    absl::MutexLock lock(&store_->mu_);
    store_->counters_.bytes_in += record.size();
  }
  if (p.layers_left > 0) return absl::OkStatus();

  // Complete: header and checksum, then visible all at once.
  const std::string header = kvblock::EncodeBlockHeader(kvblock::HeaderFor(layout_, 0, layout_.num_layers));
  KVTIER_RETURN_IF_ERROR(first.WriteAt(room, 0, header));
  uint32_t crc = kvblock::Crc32c(header.data(), header.size());
  for (uint32_t l = 0; l < layout_.num_layers; l += p.slices[l].layers) {
    crc = kvblock::Crc32cCombine(crc, p.slices[l].payload_crc, size_t{p.slices[l].layers} * h.layer_payload_bytes);
  }
  KVTIER_RETURN_IF_ERROR(first.WriteAt(room, record_bytes_ - kvblock::kBlockTrailerBytes,
                                       std::string_view(reinterpret_cast<const char*>(&crc), sizeof crc)));

  std::unique_ptr<Pending> done = std::move(it->second);
  pending_.erase(it);
  if (store_->PublishPending(ns_, hash, layout_id_, owner_, record_bytes_, std::move(done->pages))) {
    ++summary_.blocks_stored;
  } else {
    ++summary_.blocks_deduplicated;
  }
  return absl::OkStatus();
}

PutSummary PutSession::Finish() {
  for (auto& [key, pending] : pending_) {
    Abandon(*pending);
    kvblock::BlockHash hash;
    std::memcpy(hash.data(), key.data(), hash.size());
    summary_.incomplete.push_back(hash);
  }
  pending_.clear();
  deduplicated_.clear();
  return summary_;
}

}  // namespace kvtier::cache
