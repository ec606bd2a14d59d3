#include "services/cache/server/idle_streams.h"

#include <algorithm>
#include <vector>

namespace kvtier::cache {

IdleStreams::IdleStreams(absl::Duration limit)
    : limit_(limit),
      tick_(std::clamp(limit / 4, absl::Milliseconds(10), absl::Seconds(1))),
      thread_([this] { Loop(); }) {}

IdleStreams::~IdleStreams() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void IdleStreams::Add(IdleStream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.insert(stream);
}

void IdleStreams::Remove(IdleStream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
  if (std::this_thread::get_id() == thread_.get_id()) return;  // ended by the visit itself
  while (visiting_ == stream) visited_.Wait(&mu_);
}

void IdleStreams::Loop() {
  mu_.Lock();
  while (true) {
    const absl::Time wake = absl::Now() + tick_;
    if (mu_.AwaitWithDeadline(absl::Condition(&stopping_), wake)) break;
    const absl::Time cutoff = absl::Now() - limit_;
    // A copy: streams come and go while the lock is let go for each visit.
    const std::vector<IdleStream*> streams(streams_.begin(), streams_.end());
    for (IdleStream* stream : streams) {
      if (!streams_.contains(stream)) continue;  // removed since (and maybe freed)
      visiting_ = stream;
      mu_.Unlock();
      stream->ExpireIfIdleSince(cutoff);
      mu_.Lock();
      visiting_ = nullptr;
      visited_.SignalAll();
    }
  }
  mu_.Unlock();
}

}  // namespace kvtier::cache
