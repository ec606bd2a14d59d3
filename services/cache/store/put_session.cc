// Put: a PutSession assembles a stream's blocks layer by layer in the first
// tier; the store's side below takes their room, bounded, and makes each
// visible at once when whole.
#include <algorithm>
#include <array>
#include <cstring>
#include <span>

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

PutSession::PutSession(BlockStore* store, std::string ns, kvblock::LatentLayout layout, std::string owner,
                       bool cold_start, double use_stamp)
    : store_(store),
      ns_(std::move(ns)),
      segment_owner_(store->SegmentOwnerOf(ns_, owner)),  // before owner is moved from
      owner_(std::move(owner)),
      layout_(std::move(layout)),
      layout_id_(kvblock::LayoutId(layout_)),
      record_bytes_(kvblock::HeaderFor(layout_, 0, layout_.num_layers).RecordBytes()),
      cold_start_(cold_start),
      use_stamp_(use_stamp) {}

PutSession::~PutSession() {
  for (auto& [hash, pending] : pending_) Abandon(*pending);
}

void PutSession::Abandon(Pending& p) { store_->AbandonPending({ns_, p.hash, p.pages, record_bytes_, owner_}); }

absl::Status PutSession::AddSlice(const kvblock::BlockHash& hash, std::string_view record) {
  const std::span<const uint8_t> whole(reinterpret_cast<const uint8_t*>(record.data()), record.size());
  return AddSlice(hash, std::span(&whole, 1));
}

absl::Status PutSession::AddSlice(const kvblock::BlockHash& hash, std::span<const std::span<const uint8_t>> record) {
  absl::StatusOr<kvblock::BlockHeader> slice = kvblock::ParseScatteredBlock(record, &layout_);
  if (!slice.ok()) {
    if (slice.status().code() == absl::StatusCode::kDataLoss) store_->CountArrival(0, /*checksum_failed=*/true);
    return absl::Status(slice.status().code(),
                        absl::StrCat("slice of block ", kvblock::HashToHex(hash), ": ", slice.status().message()));
  }
  if (slice->format_version == kvblock::kV4BlockFormatVersion) return AddWholeRecord(hash, record, *slice);
  const std::string key(kvblock::HashAsBytes(hash));
  auto it = pending_.find(key);
  if (it == pending_.end()) {
    absl::StatusOr<std::optional<std::vector<uint32_t>>> pages =
        store_->BeginPending(ns_, segment_owner_, hash, owner_, pending_.size(), record_bytes_);
    if (!pages.ok()) return pages.status();
    if (!pages->has_value()) {  // this slice and the block's others cost nothing
      NoteDeduplicated(key);
      return absl::OkStatus();
    }
    auto pending = std::make_unique<Pending>();
    pending->hash = hash;
    pending->pages = std::move(**pages);
    pending->layers.assign(layout_.num_layers, false);
    pending->layers_left = layout_.num_layers;
    pending->slices.resize(layout_.num_layers);
    it = pending_.emplace(key, std::move(pending)).first;
    // Its room is ours alone now: made ready without the lock.
    store_->FirstTier().Prepare(it->second->pages);
  }
  Pending& p = *it->second;
  const kvblock::BlockHeader& h = *slice;
  for (uint32_t l = h.layer_begin; l < h.layer_begin + h.layer_count; ++l) {
    if (p.layers[l]) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, " of block ", kvblock::HashToHex(hash), " sent twice"));
    }
  }
  const TierStorage& first = store_->FirstTier();
  const RecordRoom room{ns_, hash, p.pages, record_bytes_, owner_};
  // The payloads, piece by piece, to where their layers go in the block.
  const size_t size = h.RecordBytes(), payloads = size - h.HeaderBytes() - kvblock::kBlockTrailerBytes;
  const size_t destination = h.HeaderBytes() + size_t{h.layer_begin} * h.layer_payload_bytes;
  size_t at = 0;  // of the piece in the slice
  for (const std::span<const uint8_t> piece : record) {
    const size_t from = std::max(at, h.HeaderBytes()), to = std::min(at + piece.size(), h.HeaderBytes() + payloads);
    if (from < to) {
      KVTIER_RETURN_IF_ERROR(
          first.WriteAt(room, destination + (from - h.HeaderBytes()),
                        std::string_view(reinterpret_cast<const char*>(piece.data()) + (from - at), to - from)));
    }
    at += piece.size();
  }
  for (uint32_t l = h.layer_begin; l < h.layer_begin + h.layer_count; ++l) p.layers[l] = true;
  p.layers_left -= h.layer_count;
  // Parsing verified crc(header || payloads), the slice's last 4 bytes;
  // the payloads' own CRC follows from it and the header's.
  std::array<uint8_t, kvblock::kIndexedBlockHeaderBytes> head;
  kvblock::CopyFromPieces(record, 0, std::span(head).first(h.HeaderBytes()));
  const uint32_t header_crc = kvblock::Crc32c(head.data(), h.HeaderBytes());
  const uint32_t slice_crc = kvblock::TrailerCrc(record, size);
  p.slices[h.layer_begin] = {h.layer_count, kvblock::Crc32cCombine(header_crc, slice_crc, payloads)};
  store_->CountArrival(size, /*checksum_failed=*/false);
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
  Publish(hash, record_bytes_, std::move(done->pages), /*v4_block=*/false);
  return absl::OkStatus();
}

void PutSession::NoteDeduplicated(const std::string& key) {
  if (deduplicated_.insert(key).second) {
    ++summary_.blocks_deduplicated;
    store_->CountDeduplicated();
  }
}

void PutSession::Publish(const kvblock::BlockHash& hash, size_t bytes, std::vector<uint32_t> pages, bool v4_block) {
  if (store_->PublishPending(ns_, hash, layout_id_, owner_, bytes, std::move(pages), last_stored_, v4_block,
                             cold_start_, use_stamp_)) {
    ++summary_.blocks_stored;
    last_stored_ = hash;
  } else {
    ++summary_.blocks_deduplicated;
  }
}

absl::Status PutSession::AddWholeRecord(const kvblock::BlockHash& hash,
                                        std::span<const std::span<const uint8_t>> record,
                                        const kvblock::BlockHeader& header) {
  const size_t size = header.RecordBytes();
  absl::StatusOr<std::optional<std::vector<uint32_t>>> pages =
      store_->BeginPending(ns_, segment_owner_, hash, owner_, pending_.size(), size);
  if (!pages.ok()) return pages.status();
  if (!pages->has_value()) {
    NoteDeduplicated(std::string(kvblock::HashAsBytes(hash)));
    return absl::OkStatus();
  }
  const TierStorage& first = store_->FirstTier();
  first.Prepare(**pages);
  const RecordRoom room{ns_, hash, **pages, size, owner_};
  size_t at = 0;
  for (const std::span<const uint8_t> piece : record) {
    if (absl::Status s =
            first.WriteAt(room, at, std::string_view(reinterpret_cast<const char*>(piece.data()), piece.size()));
        !s.ok()) {
      store_->AbandonPending(room);
      return s;
    }
    at += piece.size();
  }
  store_->CountArrival(size, /*checksum_failed=*/false);
  Publish(hash, size, std::move(**pages), header.kind == kvblock::RecordKind::kBlock);
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

// The store's side.

absl::StatusOr<std::vector<uint32_t>> BlockStore::AllocatePendingLocked(size_t bytes, const std::string& segment_owner,
                                                                        const std::string& owner,
                                                                        size_t stream_pending) {
  if (stream_pending >= options_.max_pending_per_stream) {
    return absl::ResourceExhaustedError(absl::StrCat("this Put stream holds ", stream_pending,
                                                     " incomplete blocks, the most one stream may; complete some"));
  }
  // Looked up, not held: making room below may let go of the lock.
  if (auto owned = owners_.find(owner);
      owned != owners_.end() && owned->second.pending_blocks >= options_.max_pending_per_owner) {
    return absl::ResourceExhaustedError(absl::StrCat(owned->second.pending_blocks,
                                                     " incomplete blocks of this tenant's Put streams, the most one "
                                                     "tenant may; retry later"));
  }
  if (pending_blocks_ >= options_.max_pending_blocks) {
    return absl::ResourceExhaustedError(
        absl::StrCat(pending_blocks_, " blocks are being assembled, the limit; retry later"));
  }
  Tier& first = *tiers_[0];
  // Bytes too, not only blocks: a few streams of one tenant's big
  // half-sent blocks would otherwise hold the whole device tier against the
  // others. One block alone may always begin. (Without tenants there are
  // no others: idle streams are ended instead, PutReactor.)
  const auto in_flight = owners_.find(owner);
  const uint64_t held = in_flight == owners_.end() ? 0 : in_flight->second.pending_bytes;
  const uint64_t quota = in_flight == owners_.end() ? 0 : in_flight->second.quota.pending_bytes;
  uint64_t limit = quota;  // 0: none
  if (limit == 0 && !owner.empty()) {
    limit = options_.max_pending_bytes_per_owner > 0 ? options_.max_pending_bytes_per_owner
                                                     : first.counters.capacity_bytes / 2;
  }
  if (limit > 0 && held > 0 && held + first.storage->BytesTaken(bytes) > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant ", owner, "'s Put streams hold ", held, " bytes of incomplete blocks, ",
        quota > 0 ? "its quota of " : "the most without a putBytesInFlight quota, ", limit, "; complete some"));
  }
  if (!first.storage->Fits(bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat("a block of ", bytes, " bytes does not fit the device tier (",
                                                     first.counters.capacity_bytes, " bytes)"));
  }
  if (absl::Status room = MakeRoomLocked(0, bytes, segment_owner, owner); !room.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(room.message(), "; retry later"));
  }
  std::vector<uint32_t> pages;
  if (!TakeRoomLocked(0, bytes, segment_owner, owner, pages)) {
    return absl::ResourceExhaustedError("device tier is full of blocks in use; retry later");
  }
  ++pending_blocks_;
  OwnerBook& book = owners_[owner];
  ++book.pending_blocks;
  book.pending_bytes += first.storage->BytesTaken(bytes);
  return pages;
}

void BlockStore::EndPendingLocked(const std::string& owner, size_t bytes) {
  --pending_blocks_;
  OwnerBook& book = owners_[owner];
  --book.pending_blocks;
  book.pending_bytes -= tiers_[0]->storage->BytesTaken(bytes);
  ForgetIfEmptyLocked(owner);
}

absl::StatusOr<std::optional<std::vector<uint32_t>>> BlockStore::BeginPending(const std::string& ns,
                                                                              const std::string& segment_owner,
                                                                              const kvblock::BlockHash& hash,
                                                                              const std::string& owner,
                                                                              size_t stream_pending, size_t bytes) {
  absl::MutexLock lock(&mu_);
  if (index_.count(Key(ns, hash)) > 0) return std::nullopt;
  return AllocatePendingLocked(bytes, segment_owner, owner, stream_pending);
}

void BlockStore::AbandonPending(const RecordRoom& room) {
  absl::MutexLock lock(&mu_);
  GiveRoomLocked(0, room, /*written=*/false);
  EndPendingLocked(room.owner, room.size);
}

void BlockStore::CountArrival(size_t bytes, bool checksum_failed) {
  absl::MutexLock lock(&mu_);
  counters_.bytes_in += bytes;
  if (checksum_failed) ++counters_.arrival_checksum_failures;
}

void BlockStore::CountDeduplicated() {
  absl::MutexLock lock(&mu_);
  ++counters_.blocks_deduplicated;
}

TierStorage& BlockStore::FirstTier() const { return *tiers_[0]->storage; }

bool BlockStore::PublishPending(const std::string& ns, const kvblock::BlockHash& hash, uint64_t layout_id,
                                const std::string& owner, size_t bytes, std::vector<uint32_t> pages,
                                const std::optional<kvblock::BlockHash>& after, bool v4_block, bool cold_start,
                                double use_stamp) {
  absl::MutexLock lock(&mu_);
  EndPendingLocked(owner, bytes);
  Key key(ns, hash);
  if (index_.count(key) > 0) {  // another stream finished it first
    GiveRoomLocked(0, {ns, hash, pages, bytes, owner}, /*written=*/false);
    ++counters_.blocks_deduplicated;
    return false;
  }
  auto entry = std::make_unique<Entry>();
  entry->ns = ns;
  entry->owner = owner;
  entry->hash = hash;
  entry->layout_id = layout_id;
  entry->size = bytes;
  entry->tier = 0;
  entry->pages = std::move(pages);
  entry->v4_block = v4_block;
  // Leaf-first: the stream's blocks of a prefix go last to first, so the
  // new one goes just behind the one before it.
  Entry* behind = nullptr;
  if (after.has_value() && options_.eviction != Eviction::kLru) {
    auto it = index_.find(Key(ns, *after));
    if (it != index_.end() && it->second->tier == 0) behind = it->second.get();
  }
  Tier& first = *tiers_[0];
  if (options_.eviction == Eviction::kAdaptive) {
    const uint64_t fingerprint = KeyHash()(key);
    entry->on_probation = !probation_share_.Returning(fingerprint, index_.size());
    entry->use = recency_or_frequency_.Stored(fingerprint, use_stamp, index_.size());
    recency_or_frequency_.Advance(first.storage->BytesTaken(bytes));
  }
  entry->cold_start = entry->on_probation && cold_start;
  LinkLocked(entry.get(), behind);
  ++first.counters.blocks;
  ++counters_.blocks_stored;
  if (cold_start) ++counters_.blocks_stored_cold_start;
  counters_.metadata_bytes += EntryMetadataBytes(*entry);
  index_.emplace(std::move(key), std::move(entry));
  return true;
}

std::unique_ptr<PutSession> BlockStore::BeginPut(std::string ns, kvblock::LatentLayout layout, std::string owner,
                                                 OwnerQuota quota, bool cold_start) {
  double use_stamp;
  {
    absl::MutexLock lock(&mu_);
    const bool limited = quota.tier_bytes != std::array<uint64_t, 3>{} || quota.pending_bytes > 0;
    if (limited || owners_.contains(owner)) owners_[owner].quota = quota;
    use_stamp = recency_or_frequency_.Now();
  }
  return std::unique_ptr<PutSession>(
      new PutSession(this, std::move(ns), std::move(layout), std::move(owner), cold_start, use_stamp));
}

}  // namespace kvtier::cache
