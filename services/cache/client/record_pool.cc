#include "services/cache/client/record_pool.h"

namespace kvtier::cache {

std::shared_ptr<RecordPool> RecordPool::Create(size_t max_idle_bytes) {
  return std::shared_ptr<RecordPool>(new RecordPool(max_idle_bytes));
}

std::shared_ptr<std::string> RecordPool::Take(size_t size) {
  std::unique_ptr<std::string> record;
  {
    absl::MutexLock lock(&mu_);
    held_bytes_ += size;
    auto it = idle_.find(size);
    if (it != idle_.end() && !it->second.empty()) {
      record = std::move(it->second.back());
      it->second.pop_back();
      idle_bytes_ -= size;
    }
  }
  if (record == nullptr) record = std::make_unique<std::string>(size, '\0');
  return std::shared_ptr<std::string>(record.release(),
                                      [pool = shared_from_this(), size](std::string* r) { pool->Return(r, size); });
}

size_t RecordPool::idle_bytes() const {
  absl::MutexLock lock(&mu_);
  return idle_bytes_;
}

size_t RecordPool::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_bytes_;
}

void RecordPool::Return(std::string* record, size_t taken_size) {
  std::unique_ptr<std::string> owned(record);
  absl::MutexLock lock(&mu_);
  held_bytes_ -= taken_size;
  // Freed here: past the limit, or resized by its holder (not this size's any more).
  if (owned->size() != taken_size || idle_bytes_ + owned->size() > max_idle_bytes_) return;
  idle_bytes_ += owned->size();
  idle_[owned->size()].push_back(std::move(owned));
}

}  // namespace kvtier::cache
