#include "services/cache/client/shard_routes.h"

#include <algorithm>
#include <future>

#include "absl/strings/str_cat.h"
#include "services/cache/client/cache_client.h"
#include "services/rpc/grpc_status.h"
#include "services/rpc/tenants.h"

namespace kvtier::cache {
namespace {

// The most a record of `layout` takes: MLA's one size; for DeepSeek-V4 the
// larger of a block and a restore point past the window (ParseBlock then
// checks which it is, and its exact size).
size_t LargestRecord(const kvblock::LatentLayout& layout) {
  kvblock::BlockHeader h = kvblock::HeaderFor(layout, 0, layout.num_layers);
  if (layout.IsV4()) {
    h.payload_bytes = std::max<uint32_t>(
        h.payload_bytes, static_cast<uint32_t>(kernels::V4RestorePointBytes(layout.V4Parts(), layout.sliding_window)));
  }
  return h.RecordBytes();
}

}  // namespace

RecordLanding::RecordLanding(const kvblock::LatentLayout& layout, RecordPool& pool,
                             std::vector<absl::StatusOr<SharedRecord>*> slots)
    : RecordLanding(layout, pool, LargestRecord(layout), std::move(slots)) {}

RecordLanding::RecordLanding(const kvblock::LatentLayout& layout, RecordPool& pool, size_t record_bytes,
                             std::vector<absl::StatusOr<SharedRecord>*> slots)
    : layout_(layout),
      pool_(pool),
      record_bytes_(record_bytes),
      slots_(std::move(slots)),
      landed_(slots_.size()),
      answered_(slots_.size(), false) {}

std::span<uint8_t> RecordLanding::Destination(uint32_t index, size_t size) {
  const bool fits = layout_.IsV4() ? size <= record_bytes_ : size == record_bytes_;
  if (index >= landed_.size() || !fits || answered_[index]) return {};
  if (landed_[index] == nullptr) landed_[index] = pool_.Take(size);
  return std::span(reinterpret_cast<uint8_t*>(landed_[index]->data()), size);
}

void RecordLanding::Deliver(const cache::RawBlock& block, kvblock::CrcCheck crc) {
  if (block.index >= slots_.size() || answered_[block.index]) return;
  absl::StatusOr<SharedRecord>& slot = *slots_[block.index];
  if (!block.status.ok()) {
    slot = block.status;
    answered_[block.index] = true;
    return;
  }
  std::shared_ptr<std::string>& record = landed_[block.index];
  if (record == nullptr) return;  // its room was refused: nothing landed
  if (absl::Status checked = kvblock::ParseBlock(*record, &layout_, crc).status(); !checked.ok()) {
    slot = checked;
  } else {
    slot = SharedRecord(std::move(record));
  }
  answered_[block.index] = true;
}

RecordLanding RecordLanding::Run(size_t begin, size_t end) const {
  return RecordLanding(layout_, pool_, record_bytes_, std::vector(slots_.begin() + begin, slots_.begin() + end));
}

void RecordLanding::FailUnanswered(const absl::Status& status) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!answered_[i]) *slots_[i] = status;
  }
}

std::shared_ptr<FastPathClient> FastPathRoute::Session() {
  absl::MutexLock lock(&mu_);
  if (session_ != nullptr || absl::Now() < retry_after_) return session_;
  absl::StatusOr<std::unique_ptr<FastPathClient>> opened =
      FastPathClient::Connect(channel_, deadline_, kStagingBytes, FastPathClient::DeviceStagingWanted());
  if (!opened.ok()) {
    // No fast path there (another host, or off): ask again now and then,
    // since a restarted cache may have one; rarely when it said so itself.
    const bool refused = opened.status().code() == absl::StatusCode::kFailedPrecondition;
    retry_after_ = absl::Now() + (refused ? absl::Minutes(5) : absl::Seconds(10));
    return nullptr;
  }
  session_ = *std::move(opened);
  return session_;
}

std::vector<uint32_t> FastPathRoute::Fetch(const std::string& ns, const kvblock::LatentLayout& layout,
                                           const std::vector<kvblock::BlockHash>& hashes, RecordLanding& landing,
                                           const std::string& /*acting_for: the session is this process's*/) {
  std::shared_ptr<FastPathClient> session = Session();
  absl::StatusOr<std::vector<uint32_t>> left = absl::UnavailableError("no fast path session");
  if (session != nullptr) {
    // The fast path checks each record's CRC as it copies it.
    left = session->Fetch(ns, layout, hashes, landing.AsDestination(), [&](const cache::RawBlock& block) {
      landing.Deliver(block, kvblock::CrcCheck::kCheckedBefore);
    });
    if (left.ok()) return *std::move(left);
    SessionFailed(session);  // e.g. the cache restarted: a new session next time
  }
  // Nothing delivered: all of it for the next route.
  std::vector<uint32_t> all(hashes.size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  return all;
}

std::shared_ptr<FastPathClient> FastPathRoute::PutStaging() {
  std::shared_ptr<FastPathClient> session = Session();
  return session != nullptr && session->staging_bytes() > 0 ? session : nullptr;
}

void FastPathRoute::SessionFailed(const std::shared_ptr<FastPathClient>& session) {
  absl::MutexLock lock(&mu_);
  if (session_ == session) session_.reset();
}

std::vector<uint32_t> GrpcRoute::Fetch(const std::string& ns, const kvblock::LatentLayout& layout,
                                       const std::vector<kvblock::BlockHash>& hashes, RecordLanding& landing,
                                       const std::string& acting_for) {
  // As many runs as connections are free: reads already under way keep
  // theirs.
  const size_t most = std::min({streams_, connections_->Unused(), hashes.size()});
  const size_t runs =
      std::clamp<size_t>(hashes.size() * landing.record_bytes() / kStreamBytes, 1, std::max<size_t>(most, 1));
  if (runs == 1) {
    FetchRun(ns, layout, hashes, landing, acting_for);
    return {};
  }
  const auto first = [&](size_t r) { return hashes.size() * r / runs; };  // run r: [first(r), first(r + 1))
  std::vector<RecordLanding> landings;
  landings.reserve(runs);
  for (size_t r = 0; r < runs; ++r) landings.push_back(landing.Run(first(r), first(r + 1)));
  const auto run = [&](size_t r) {
    const std::vector<kvblock::BlockHash> part(hashes.begin() + first(r), hashes.begin() + first(r + 1));
    FetchRun(ns, layout, part, landings[r], acting_for);
  };
  std::vector<std::future<void>> others;
  for (size_t r = 1; r < runs; ++r) others.push_back(std::async(std::launch::async, run, r));
  run(0);
  for (std::future<void>& other : others) other.get();
  return {};
}

void GrpcRoute::FetchRun(const std::string& ns, const kvblock::LatentLayout& layout,
                         const std::vector<kvblock::BlockHash>& hashes, RecordLanding& landing,
                         const std::string& acting_for) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
  if (!acting_for.empty()) context.AddMetadata(kActingForMetadata, acting_for);
  const StreamConnections::Lease connection = connections_->Take();
  const grpc::Status status =
      RawGet(connection.channel(), &context, cache::MakeGetRequest(ns, layout, hashes), landing.AsDestination(),
             [&](const cache::RawBlock& block) { landing.Deliver(block, kvblock::CrcCheck::kCheck); });
  if (!status.ok()) {
    const absl::Status failed = FromGrpcStatus(status);
    landing.FailUnanswered(absl::Status(failed.code(), absl::StrCat("cache ", target_, ": ", failed.message())));
  }
}

}  // namespace kvtier::cache
