#include "services/cache/client/shard_set.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <optional>

#include "absl/strings/str_cat.h"
#include "services/base/log.h"
#include "services/base/peer_discovery.h"
#include "services/base/status.h"
#include "services/base/usable_cpus.h"
#include "services/cache/client/health_check.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/sha256.h"
#include "services/rpc/client_identity.h"
#include "services/rpc/tenants.h"

namespace kvtier::cache {
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

// A stream for every four usable cores: where one stream already keeps the
// cores busy, more only add switching between their threads
// (docs/notes/2026-12-05-fetch-streams.md).
size_t FetchStreams(size_t asked) {
  if (asked == 0) asked = UsableCpus() / 4;
  return std::clamp<size_t>(asked, 1, StreamConnections::kConnections);
}

}  // namespace

struct ShardSet::Shard {
  Shard(const std::string& target, absl::Duration deadline, bool fast_path, size_t fetch_streams)
      : target(target),
        seed(First8(kvblock::Sha256({target}))),
        channel(MakeChannel(target)),
        streams(target),
        client(channel, deadline),
        put(&streams, &routes, [this] { return Down(); }) {
    if (fast_path) routes.push_back(std::make_unique<FastPathRoute>(channel, deadline));
    routes.push_back(std::make_unique<GrpcRoute>(target, &streams, deadline, fetch_streams));
  }
  bool Down() const { return health.load(std::memory_order_relaxed) == Health::kDown; }

  const std::string target;
  const uint64_t seed;  // from the target: a shard's scores do not depend on the others
  const std::shared_ptr<grpc::Channel> channel;
  StreamConnections streams;  // Fetch's Gets, ShardedPut's Puts
  CacheClient client;
  std::vector<std::unique_ptr<ShardRoute>> routes;  // tried in order; gRPC last
  PutRoute put;
  std::atomic<Health> health{Health::kUnknown};
};

ShardSet::ShardSet(absl::Duration deadline, bool fast_path, size_t idle_record_bytes, size_t fetch_streams)
    : deadline_(deadline),
      fast_path_(fast_path),
      fetch_streams_(FetchStreams(fetch_streams)),
      records_(RecordPool::Create(idle_record_bytes)),
      members_(std::make_shared<ShardList>()) {}

ShardSet::~ShardSet() {
  stop_health_checks_.Notify();
  if (health_checks_.joinable()) health_checks_.join();
}

absl::Status ShardSet::CheckFetchStreams(uint64_t fetch_streams) {
  if (fetch_streams <= StreamConnections::kConnections) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("must be 0 to ", StreamConnections::kConnections));
}

absl::StatusOr<std::unique_ptr<ShardSet>> ShardSet::Create(const std::string& targets, absl::Duration deadline,
                                                           bool fast_path, size_t idle_record_bytes,
                                                           size_t fetch_streams) {
  absl::StatusOr<std::vector<std::string>> list = ParseTargetList(targets);
  if (!list.ok()) return absl::InvalidArgumentError(absl::StrCat("cache shards: ", list.status().message()));
  auto set = std::make_unique<ShardSet>(deadline, fast_path, idle_record_bytes, fetch_streams);
  KVTIER_RETURN_IF_ERROR(set->SetTargets(*list));
  return set;
}

absl::Status ShardSet::SetTargets(const std::vector<std::string>& targets) {
  if (absl::Status valid = ValidateTargets(targets); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cache shards: ", valid.message()));
  }
  absl::MutexLock lock(&mu_);
  auto next = std::make_shared<ShardList>();
  for (const std::string& target : targets) {
    auto kept = std::find_if(members_->begin(), members_->end(),
                             [&](const std::shared_ptr<Shard>& s) { return s->target == target; });
    next->push_back(kept != members_->end() ? *kept
                                            : std::make_shared<Shard>(target, deadline_, fast_path_, fetch_streams_));
  }
  members_ = std::move(next);
  return absl::OkStatus();
}

std::shared_ptr<const ShardSet::ShardList> ShardSet::Members() const {
  absl::MutexLock lock(&mu_);
  return members_;
}

size_t ShardSet::IndexOf(const ShardList& shards, const kvblock::BlockHash& hash) {
  const uint64_t key = First8(hash);
  size_t best = 0;
  uint64_t best_score = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const uint64_t score = Mix(shards[s]->seed ^ key);
    if (s == 0 || score > best_score) best = s, best_score = score;
  }
  return best;
}

std::string ShardSet::ShardOf(const kvblock::BlockHash& hash) const {
  const std::shared_ptr<const ShardList> shards = Members();
  return shards->empty() ? "" : (*shards)[IndexOf(*shards, hash)]->target;
}

void ShardSet::CheckHealth() {
  const std::shared_ptr<const ShardList> shards = Members();
  std::vector<std::future<void>> done;
  for (const std::shared_ptr<Shard>& shard : *shards) {
    done.push_back(std::async(std::launch::async, [this, &shard] {
      if (shard->health.load() == Health::kDown) {
        // A shard that is back (a restarted pod) is used within this
        // interval, not once gRPC's reconnect backoff runs out.
        grpc::experimental::ChannelResetConnectionBackoff(shard->channel.get());
        shard->streams.ResetBackoff();
      }
      const absl::Status checked = cache::CheckHealth(shard->channel, deadline_);
      const Health now = checked.ok() ? Health::kUp : Health::kDown;
      const Health before = shard->health.exchange(now);
      if (now == before) return;
      if (now == Health::kUp) {
        Log(LogLevel::kInfo, "cache", absl::StrCat("shard ", shard->target, " is reachable"));
      } else {
        Log(LogLevel::kWarning, "cache",
            absl::StrCat("shard ", shard->target,
                         " is unreachable (its blocks are recomputed until it is back): ", checked.message()));
      }
    }));
  }
  for (auto& d : done) d.get();
}

void ShardSet::StartHealthChecks(absl::Duration interval) {
  health_checks_ = std::thread([this, interval] {
    do {
      CheckHealth();
    } while (!stop_health_checks_.WaitForNotificationWithTimeout(interval));
  });
}

std::vector<std::pair<std::string, ShardSet::Health>> ShardSet::HealthOfShards() const {
  const std::shared_ptr<const ShardList> shards = Members();  // held while the loop reads it
  std::vector<std::pair<std::string, Health>> out;
  for (const std::shared_ptr<Shard>& shard : *shards) out.emplace_back(shard->target, shard->health.load());
  return out;
}

size_t ShardSet::MatchPrefix(const std::string& ns, const kvblock::LatentLayout& layout,
                             const std::vector<kvblock::BlockHash>& chain, const std::string& acting_for) {
  const std::shared_ptr<const ShardList> shards = Members();
  if (shards->empty()) return 0;
  // Each shard is asked about its own blocks, in chain order; the prefix
  // ends at the first block some shard does not hold.
  const std::vector<std::vector<size_t>> positions = ByShard(*shards, chain);
  size_t prefix = chain.size();
  absl::Mutex points_mu;
  std::vector<size_t> points;  // V4: chain positions whose restore point is stored
  std::vector<std::future<size_t>> answers;
  for (size_t s = 0; s < shards->size(); ++s) {
    if (positions[s].empty()) continue;
    Shard& shard = *(*shards)[s];
    if (shard.Down()) {  // holds none: the prefix ends at its first block at the latest
      prefix = std::min(prefix, positions[s][0]);
      continue;
    }
    answers.push_back(std::async(std::launch::async, [&, s]() -> size_t {
      std::vector<kvblock::BlockHash> mine;
      for (size_t i : positions[s]) mine.push_back(chain[i]);
      std::optional<CacheClient> acting;  // a client of its own names the end tenant
      if (!acting_for.empty()) {
        acting.emplace(shard.channel, deadline_);
        acting->ActFor(acting_for);
      }
      absl::StatusOr<v1::MatchResponse> r = (acting ? *acting : shard.client).Match(ns, layout, mine);
      // A V4 shard's answer is cut back to its own last restore point; the
      // stored prefix and where its points are say more.
      const size_t matched =
          !r.ok() ? 0 : std::min<size_t>(layout.IsV4() ? r->stored_blocks() : r->matched_blocks(), mine.size());
      if (r.ok() && layout.IsV4()) {
        absl::MutexLock lock(&points_mu);
        for (uint32_t i : r->restore_points()) {
          if (i < matched) points.push_back(positions[s][i]);
        }
      }
      return matched == mine.size() ? chain.size() : positions[s][matched];
    }));
  }
  for (auto& a : answers) prefix = std::min(prefix, a.get());
  if (!layout.IsV4()) return prefix;
  // The longest prefix every shard holds that ends at a restore point.
  size_t restorable = 0;
  for (size_t i : points) {
    if (i < prefix) restorable = std::max(restorable, i + 1);
  }
  return restorable;
}

std::vector<absl::StatusOr<SharedRecord>> ShardSet::Fetch(const std::string& ns, const kvblock::LatentLayout& layout,
                                                          const std::vector<kvblock::BlockHash>& hashes,
                                                          const std::string& acting_for,
                                                          const std::vector<kvblock::BlockHash>& shard_keys) {
  const std::shared_ptr<const ShardList> shards = Members();
  std::vector<absl::StatusOr<SharedRecord>> out(hashes.size(), absl::UnavailableError("no cache shard"));
  const std::vector<std::vector<size_t>> positions = ByShard(*shards, shard_keys.empty() ? hashes : shard_keys);
  std::vector<std::future<void>> done;
  for (size_t s = 0; s < shards->size(); ++s) {
    if (positions[s].empty()) continue;
    Shard& shard = *(*shards)[s];
    if (shard.Down()) {
      for (size_t i : positions[s]) {
        out[i] = absl::UnavailableError(absl::StrCat("cache ", shard.target, " failed its last health check"));
      }
      continue;
    }
    done.push_back(std::async(std::launch::async, [&, s] {
      FetchFromShard(*(*shards)[s], ns, layout, hashes, positions[s], out, acting_for);
    }));
  }
  for (auto& d : done) d.get();
  return out;
}

void ShardSet::FetchFromShard(Shard& shard, const std::string& ns, const kvblock::LatentLayout& layout,
                              const std::vector<kvblock::BlockHash>& hashes, std::vector<size_t> indices,
                              std::vector<absl::StatusOr<SharedRecord>>& out, const std::string& acting_for) {
  for (const std::unique_ptr<ShardRoute>& route : shard.routes) {
    if (indices.empty()) return;
    std::vector<kvblock::BlockHash> mine;
    std::vector<absl::StatusOr<SharedRecord>*> slots;
    for (size_t i : indices) {
      mine.push_back(hashes[i]);
      slots.push_back(&out[i]);
    }
    RecordLanding landing(layout, *records_, std::move(slots));
    std::vector<size_t> left;
    for (uint32_t i : route->Fetch(ns, layout, mine, landing, acting_for)) {
      if (i < indices.size()) left.push_back(indices[i]);
    }
    indices = std::move(left);
  }
}

std::set<kvblock::BlockHash> ShardSet::Store(const std::string& ns, const kvblock::LatentLayout& layout,
                                             const std::vector<BlockSlices>& blocks, const std::string& acting_for) {
  ShardedPut put(*this, ns, layout, deadline_, acting_for);
  for (const BlockSlices& b : blocks) {
    for (const std::string& record : b.records) put.Write(b.hash, record, b.shard_key);
  }
  return put.Finish();
}

std::vector<std::vector<size_t>> ShardSet::ByShard(const ShardList& shards,
                                                   const std::vector<kvblock::BlockHash>& hashes) {
  std::vector<std::vector<size_t>> positions(shards.size());
  if (shards.empty()) return positions;
  for (size_t i = 0; i < hashes.size(); ++i) positions[IndexOf(shards, hashes[i])].push_back(i);
  return positions;
}

ShardSet::PutTargets ShardSet::ForPut() const {
  const std::shared_ptr<const ShardList> shards = Members();
  PutTargets targets;
  // Each route keeps the whole list (and so its shard) alive.
  for (const std::shared_ptr<Shard>& shard : *shards) targets.shards.emplace_back(shards, &shard->put);
  targets.shard_of = [shards](const kvblock::BlockHash& hash) { return IndexOf(*shards, hash); };
  return targets;
}

ShardedPut::ShardedPut(ShardSet& shards, std::string ns, const kvblock::LatentLayout& layout,
                       absl::Duration finish_deadline, std::string acting_for, bool cold_start)
    : targets_(shards.ForPut()),
      ns_(std::move(ns)),
      layout_(layout),
      finish_deadline_(finish_deadline),
      acting_for_(std::move(acting_for)),
      cold_start_(cold_start),
      streams_(targets_.shards.size()) {}

ShardedPut::~ShardedPut() {
  for (auto& s : streams_) {
    if (s != nullptr) s->Cancel();
  }
  Finish();
}

void ShardedPut::Write(const kvblock::BlockHash& hash, std::shared_ptr<const std::string> record,
                       const std::optional<kvblock::BlockHash>& shard_key) {
  if (targets_.shards.empty()) return;
  const size_t index = targets_.shard_of(shard_key.value_or(hash));
  std::unique_ptr<PutStream>& s = streams_[index];
  if (s == nullptr && (s = targets_.shards[index]->Open(ns_, layout_, acting_for_, cold_start_)) == nullptr) return;
  s->Write(hash, std::move(record));
}

void ShardedPut::Flush() {
  for (auto& s : streams_) {
    if (s != nullptr) s->Flush();
  }
}

std::set<kvblock::BlockHash> ShardedPut::Finish() {
  // Every shard confirms at once; one that does not answer in time is
  // cancelled.
  std::vector<std::pair<PutStream*, std::future<std::set<kvblock::BlockHash>>>> answers;
  for (std::unique_ptr<PutStream>& s : streams_) {
    if (s == nullptr) continue;
    answers.emplace_back(s.get(), std::async(std::launch::async, [stream = s.get()] { return stream->Finish(); }));
  }
  const auto deadline = absl::ToChronoTime(absl::Now() + finish_deadline_);
  std::set<kvblock::BlockHash> stored;
  for (auto& [stream, answer] : answers) {
    if (answer.wait_until(deadline) != std::future_status::ready) stream->Cancel();
    stored.merge(answer.get());
  }
  for (auto& s : streams_) s.reset();
  return stored;
}

}  // namespace kvtier::cache
