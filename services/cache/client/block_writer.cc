#include "services/cache/client/block_writer.h"

namespace kvtier::cache {

BlockWriter::BlockWriter(ShardSet& shards, size_t max_queued)
    : shards_(shards), max_queued_(max_queued), thread_([this] { Loop(); }) {}

BlockWriter::~BlockWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

uint64_t BlockWriter::Enqueue(const std::string& ns, const kvblock::LatentLayout& layout,
                              const kvblock::BlockHash& hash, std::string record, const std::string& acting_for,
                              const std::optional<kvblock::BlockHash>& shard_key) {
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= max_queued_) return 0;
  queue_.push_back({ns, layout, hash, std::move(record), acting_for, shard_key});
  return ++queued_;
}

void BlockWriter::WaitFor(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto attempted = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return attempted_ >= ticket; };
  mu_.Await(absl::Condition(&attempted));
}

void BlockWriter::WhenAttempted(uint64_t ticket, std::function<void()> then) {
  {
    absl::MutexLock lock(&mu_);
    if (attempted_ < ticket) {
      waiting_.emplace(ticket, std::move(then));
      return;
    }
  }
  then();
}

void BlockWriter::Loop() {
  for (;;) {
    Item item;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and everything written
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    shards_.Store(item.ns, item.layout, {{item.hash, {std::move(item.record)}, item.shard_key}}, item.acting_for);
    std::vector<std::function<void()>> due;
    {
      absl::MutexLock lock(&mu_);
      ++attempted_;
      const auto end = waiting_.upper_bound(attempted_);
      for (auto it = waiting_.begin(); it != end; ++it) due.push_back(std::move(it->second));
      waiting_.erase(waiting_.begin(), end);
    }
    for (std::function<void()>& then : due) then();
  }
}

}  // namespace kvtier::cache
