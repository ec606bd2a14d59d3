#include "services/serving/bulk_connections.h"

#include "absl/strings/str_cat.h"

namespace kvtier::serving {

std::unique_ptr<cache::BulkClient> BulkConnections::Take() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (!idle_.empty() && now - idle_.back().since > kMaxIdle) idle_.clear();  // the rest are older
  if (!idle_.empty()) {
    std::unique_ptr<cache::BulkClient> connection = std::move(idle_.back().connection);
    idle_.pop_back();
    return connection;
  }
  if (now < retry_after_) return nullptr;
  if (address_.empty()) {
    absl::StatusOr<v1::StatsResponse> stats = client_->Stats();
    if (!stats.ok() || stats->bulk_port() == 0) {
      // Asked again now and then, rarely when the cache said it has none.
      retry_after_ = now + (stats.ok() ? absl::Minutes(5) : absl::Seconds(10));
      return nullptr;
    }
    address_ = absl::StrCat(target_.substr(0, target_.rfind(':')), ":", stats->bulk_port());
  }
  absl::StatusOr<std::unique_ptr<cache::BulkClient>> connected = cache::BulkClient::Connect(address_, io_timeout_);
  if (!connected.ok()) {
    address_.clear();
    retry_after_ = now + absl::Seconds(10);
    return nullptr;
  }
  return *std::move(connected);
}

void BulkConnections::Give(std::unique_ptr<cache::BulkClient> connection) {
  absl::MutexLock lock(&mu_);
  if (connection->broken()) {
    address_.clear();
    idle_.clear();  // likely broken too (a restart)
    retry_after_ = absl::Now() + absl::Seconds(10);
    return;
  }
  if (idle_.size() < kIdle) idle_.push_back({std::move(connection), absl::Now()});
}

}  // namespace kvtier::serving
