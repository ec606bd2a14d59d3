#include "services/prefill/stall_watch.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace kvtier::prefill {

void StallWatch::Watched::Progress() {
  absl::MutexLock lock(&mu_);
  last_ = absl::Now();
}

bool StallWatch::Watched::fired() {
  absl::MutexLock lock(&mu_);
  return fired_;
}

void StallWatch::Watched::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

bool StallWatch::Watched::over() {
  absl::MutexLock lock(&mu_);
  return stopped_ || fired_;
}

void StallWatch::Watched::CancelIfIdleSince(absl::Time cutoff) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ || fired_ || last_ >= cutoff) return;
    fired_ = true;
  }
  if (std::shared_ptr<void> alive = owner_.lock()) call_->TryCancel();
}

StallWatch::StallWatch(absl::Duration idle) : idle_(idle), thread_([this] { Loop(); }) {}

StallWatch::~StallWatch() {
  stop_.Notify();
  thread_.join();
}

std::shared_ptr<StallWatch::Watched> StallWatch::Watch(std::weak_ptr<void> owner, grpc::ClientContext* call) {
  std::shared_ptr<Watched> watched(new Watched(std::move(owner), call, absl::Now()));
  absl::MutexLock lock(&mu_);
  watched_.push_back(watched);
  return watched;
}

void StallWatch::Loop() {
  // A stall is noticed within a quarter of `idle` after it is due.
  const absl::Duration every = std::clamp(idle_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  while (!stop_.WaitForNotificationWithTimeout(every)) {
    std::vector<std::shared_ptr<Watched>> watched;
    {
      absl::MutexLock lock(&mu_);
      watched = watched_;
    }
    // Without mu_: a cancelled call may end inline, and its stream open
    // the next, watched here.
    const absl::Time cutoff = absl::Now() - idle_;
    for (const std::shared_ptr<Watched>& w : watched) w->CancelIfIdleSince(cutoff);
    absl::MutexLock lock(&mu_);
    std::erase_if(watched_, [](const std::shared_ptr<Watched>& w) { return w->over(); });
  }
}

}  // namespace kvtier::prefill
