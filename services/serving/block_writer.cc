#include "services/serving/block_writer.h"

namespace kvtier::serving {

BlockWriter::BlockWriter(ShardSet& shards, size_t max_queued)
    : shards_(shards), max_queued_(max_queued), thread_([this] { Loop(); }) {}

BlockWriter::~BlockWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

bool BlockWriter::Enqueue(const std::string& ns, const kvblock::LatentLayout& layout,
                          const kvblock::BlockHash& hash, std::string record) {
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= max_queued_) {
    ++failed_;
    return false;
  }
  queue_.push_back({ns, layout, hash, std::move(record)});
  return true;
}

uint64_t BlockWriter::stored() const {
  absl::MutexLock lock(&mu_);
  return stored_;
}

uint64_t BlockWriter::failed() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

void BlockWriter::Flush() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !busy_; };
  mu_.Await(absl::Condition(&idle));
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
      busy_ = true;
    }
    const bool ok = shards_.Store(item.ns, item.layout, {{item.hash, {std::move(item.record)}}}).contains(item.hash);
    absl::MutexLock lock(&mu_);
    busy_ = false;
    ++(ok ? stored_ : failed_);
  }
}

}  // namespace kvtier::serving
