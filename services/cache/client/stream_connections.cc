#include "services/cache/client/stream_connections.h"

#include <algorithm>

#include "services/cache/client/cache_client.h"
#include "services/rpc/client_identity.h"

namespace kvtier::cache {

StreamConnections::StreamConnections(const std::string& target) : streams_(kConnections, 0) {
  for (size_t k = 0; k < kConnections; ++k) {
    channels_.push_back(MakeChannel(target, Connection::kOwn));
    stubs_.push_back(v1::KvCache::NewStub(channels_.back()));
  }
}

StreamConnections::Lease StreamConnections::Take() {
  absl::MutexLock lock(&mu_);
  const size_t k = std::min_element(streams_.begin(), streams_.end()) - streams_.begin();
  ++streams_[k];
  return Lease(this, k);
}

size_t StreamConnections::Unused() {
  absl::MutexLock lock(&mu_);
  return std::count(streams_.begin(), streams_.end(), 0);
}

StreamConnections::Lease::~Lease() {
  if (owner_ == nullptr) return;
  absl::MutexLock lock(&owner_->mu_);
  --owner_->streams_[index_];
}

void StreamConnections::ResetBackoff() {
  for (const std::shared_ptr<grpc::Channel>& channel : channels_) {
    grpc::experimental::ChannelResetConnectionBackoff(channel.get());
  }
}

}  // namespace kvtier::cache
