#include "services/serving/shard_set.h"

#include <algorithm>
#include <future>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/common/address.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/sha256.h"

namespace kvtier::serving {
namespace {

uint64_t First8(const std::array<uint8_t, 32>& bytes) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | bytes[i];
  return v;
}

// SplitMix64's finalizer: a shard's seed mixed with the key's own (already
// uniform) bits gives independent scores per shard.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardSet>> ShardSet::Create(const std::string& targets, absl::Duration deadline,
                                                           bool fast_path, size_t idle_record_bytes) {
  auto set = std::unique_ptr<ShardSet>(new ShardSet());
  set->deadline_ = deadline;
  set->records_ = RecordPool::Create(idle_record_bytes);
  std::set<std::string> seen;
  for (absl::string_view t : absl::StrSplit(targets, ',', absl::SkipWhitespace())) {
    const std::string target(t);
    if (absl::Status s = ValidateTargetAddress(target); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("cache shard: ", s.message()));
    }
    if (!seen.insert(target).second)
      return absl::InvalidArgumentError(absl::StrCat("cache shard ", target, " is listed twice"));
    std::shared_ptr<grpc::Channel> channel = cache::CacheClient::Connect(target);
    Shard shard{target,
                First8(kvblock::Sha256({target})),
                std::make_unique<StreamConnections>(target),
                std::make_unique<cache::CacheClient>(channel, deadline),
                {}};
    if (fast_path) shard.routes.push_back(std::make_unique<FastPathRoute>(channel, deadline));
    shard.routes.push_back(std::make_unique<GrpcRoute>(target, shard.streams.get(), deadline));
    set->shards_.push_back(std::move(shard));
  }
  if (set->shards_.empty()) return absl::InvalidArgumentError("no cache shard given");
  return set;
}

size_t ShardSet::ShardOf(const kvblock::BlockHash& hash) const {
  const uint64_t key = First8(hash);
  size_t best = 0;
  uint64_t best_score = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    const uint64_t score = Mix(shards_[s].seed ^ key);
    if (s == 0 || score > best_score) best = s, best_score = score;
  }
  return best;
}

size_t ShardSet::MatchPrefix(const std::string& ns, const kvblock::LatentLayout& layout,
                             const std::vector<kvblock::BlockHash>& chain) {
  // Each shard is asked about its own blocks, in chain order; the prefix
  // ends at the first block some shard does not hold.
  const std::vector<std::vector<size_t>> positions = ByShard(chain);
  std::vector<std::future<size_t>> answers;
  for (size_t s = 0; s < shards_.size(); ++s) {
    answers.push_back(std::async(std::launch::async, [&, s]() -> size_t {
      if (positions[s].empty()) return chain.size();
      std::vector<kvblock::BlockHash> mine;
      for (size_t i : positions[s]) mine.push_back(chain[i]);
      absl::StatusOr<v1::MatchResponse> r = shards_[s].client->Match(ns, layout, mine);
      const size_t matched = r.ok() ? std::min<size_t>(r->matched_blocks(), mine.size()) : 0;
      return matched == mine.size() ? chain.size() : positions[s][matched];
    }));
  }
  size_t prefix = chain.size();
  for (auto& a : answers) prefix = std::min(prefix, a.get());
  return prefix;
}

std::vector<absl::StatusOr<SharedRecord>> ShardSet::Fetch(const std::string& ns, const kvblock::LatentLayout& layout,
                                                          const std::vector<kvblock::BlockHash>& hashes) {
  std::vector<absl::StatusOr<SharedRecord>> out(hashes.size(), absl::NotFoundError("not fetched"));
  const std::vector<std::vector<size_t>> positions = ByShard(hashes);
  std::vector<std::future<void>> done;
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (positions[s].empty()) continue;
    done.push_back(
        std::async(std::launch::async, [&, s] { FetchFromShard(s, ns, layout, hashes, positions[s], out); }));
  }
  for (auto& d : done) d.get();
  return out;
}

void ShardSet::FetchFromShard(size_t s, const std::string& ns, const kvblock::LatentLayout& layout,
                              const std::vector<kvblock::BlockHash>& hashes, std::vector<size_t> indices,
                              std::vector<absl::StatusOr<SharedRecord>>& out) {
  for (const std::unique_ptr<ShardRoute>& route : shards_[s].routes) {
    if (indices.empty()) return;
    std::vector<kvblock::BlockHash> mine;
    std::vector<absl::StatusOr<SharedRecord>*> slots;
    for (size_t i : indices) {
      mine.push_back(hashes[i]);
      slots.push_back(&out[i]);
    }
    RecordLanding landing(layout, *records_, std::move(slots));
    std::vector<size_t> left;
    for (uint32_t i : route->Fetch(ns, layout, mine, landing)) {
      if (i < indices.size()) left.push_back(indices[i]);
    }
    indices = std::move(left);
  }
}

std::set<kvblock::BlockHash> ShardSet::Store(const std::string& ns, const kvblock::LatentLayout& layout,
                                             const std::vector<cache::BlockSlices>& blocks) {
  ShardedPut put(*this, ns, layout, deadline_);
  for (const cache::BlockSlices& b : blocks) {
    for (const std::string& record : b.records) put.Write(b.hash, record);
  }
  return put.Finish();
}

std::vector<std::vector<size_t>> ShardSet::ByShard(const std::vector<kvblock::BlockHash>& hashes) const {
  std::vector<std::vector<size_t>> positions(shards_.size());
  for (size_t i = 0; i < hashes.size(); ++i) positions[ShardOf(hashes[i])].push_back(i);
  return positions;
}

struct ShardedPut::Stream {
  // A local shard's session, from `staging_route`: slices go through its
  // staging region. Declared first so that `staged` (whose chunks go back
  // once the stream is over) is destroyed before it.
  ShardRoute* staging_route = nullptr;
  std::shared_ptr<cache::FastPathClient> fast;
  std::unique_ptr<cache::FastPathClient::StagedStream> staged;
  std::optional<StreamConnections::Lease> connection;
  grpc::ClientContext context;
  v1::PutResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::PutRequest>> writer;
  bool open = false;
  std::set<kvblock::BlockHash> written;
  // Slices not sent yet, and the inline bytes among them.
  v1::PutRequest batch;
  size_t inline_bytes = 0;

  void FlushBatch() {
    if (!open || batch.batch().slices_size() == 0) return;
    open = writer->Write(batch);
    batch.mutable_batch()->clear_slices();
    inline_bytes = 0;
  }
};

ShardedPut::ShardedPut(ShardSet& shards, std::string ns, const kvblock::LatentLayout& layout,
                       absl::Duration finish_deadline)
    : shards_(shards),
      ns_(std::move(ns)),
      layout_(layout),
      finish_deadline_(finish_deadline),
      streams_(shards.size()) {}

ShardedPut::~ShardedPut() {
  for (auto& s : streams_) {
    if (s != nullptr && s->open) s->context.TryCancel();
  }
  Finish();
}

void ShardedPut::Write(const kvblock::BlockHash& hash, const std::string& record) {
  const size_t shard = shards_.ShardOf(hash);
  std::unique_ptr<Stream>& s = streams_[shard];
  if (s == nullptr) {
    s = std::make_unique<Stream>();
    v1::PutRequest header;
    for (const std::unique_ptr<ShardRoute>& route : shards_.routes(shard)) {
      if ((s->fast = route->PutStaging()) != nullptr) {
        s->staging_route = route.get();
        break;
      }
    }
    if (s->fast != nullptr) {
      s->staged = std::make_unique<cache::FastPathClient::StagedStream>(s->fast.get());
      header.mutable_header()->set_fast_path_session_id(s->fast->session_id());
    }
    s->connection.emplace(shards_.TakeConnection(shard));
    s->writer = s->connection->stub().Put(&s->context, &s->response);
    header.mutable_header()->set_kv_namespace(ns_);
    *header.mutable_header()->mutable_layout() = kvblock::LayoutToProto(layout_);
    s->open = s->writer->Write(header);
  }
  if (!s->open) return;
  s->written.insert(hash);
  // Through the staging region when there is room in it, else inline.
  v1::LayerSlice* batched = s->batch.mutable_batch()->add_slices();
  batched->set_block_hash(std::string(kvblock::HashAsBytes(hash)));
  if (std::optional<v1::StagedRange> staged = s->staged != nullptr ? s->staged->Stage(record) : std::nullopt) {
    *batched->mutable_staged() = *staged;
  } else {
    batched->set_data(record);
    s->inline_bytes += record.size();
  }
  if (s->batch.batch().slices_size() >= kSlicesPerMessage || s->inline_bytes >= kInlineBytesPerMessage) {
    s->FlushBatch();
  }
}

void ShardedPut::Flush() {
  for (auto& s : streams_) {
    if (s != nullptr) s->FlushBatch();
  }
}

std::set<kvblock::BlockHash> ShardedPut::Finish() {
  // Every shard confirms at once; one that does not answer in time is
  // cancelled.
  std::vector<std::future<grpc::Status>> answers;
  for (std::unique_ptr<Stream>& s : streams_) {
    if (s == nullptr) continue;
    Stream* stream = s.get();
    answers.push_back(std::async(std::launch::async, [stream] {
      stream->FlushBatch();
      if (stream->open) stream->writer->WritesDone();
      return stream->writer->Finish();
    }));
  }
  const auto deadline = absl::ToChronoTime(absl::Now() + finish_deadline_);
  std::set<kvblock::BlockHash> stored;
  size_t next = 0;
  for (size_t shard = 0; shard < streams_.size(); ++shard) {
    std::unique_ptr<Stream>& s = streams_[shard];
    if (s == nullptr) continue;
    std::future<grpc::Status>& answer = answers[next++];
    if (answer.wait_until(deadline) != std::future_status::ready) s->context.TryCancel();
    const grpc::Status status = answer.get();
    if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION && s->fast != nullptr) {
      s->staging_route->SessionFailed(s->fast);  // e.g. the cache restarted
    }
    if (status.ok()) {
      std::set<std::string> incomplete(s->response.incomplete_block_hashes().begin(),
                                       s->response.incomplete_block_hashes().end());
      for (const kvblock::BlockHash& h : s->written) {
        if (!incomplete.count(std::string(kvblock::HashAsBytes(h)))) stored.insert(h);
      }
    }
    s.reset();
  }
  return stored;
}

}  // namespace kvtier::serving
