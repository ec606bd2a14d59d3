#include "services/prefill/stall_watch.h"

#include <algorithm>

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
  call_ = nullptr;
}

bool StallWatch::Watched::CancelIfIdleSince(absl::Time cutoff) {
  absl::MutexLock lock(&mu_);
  if (call_ == nullptr) return false;
  if (last_ >= cutoff) return true;
  fired_ = true;
  call_->TryCancel();
  call_ = nullptr;
  return false;
}

StallWatch::StallWatch(absl::Duration idle) : idle_(idle), thread_([this] { Loop(); }) {}

StallWatch::~StallWatch() {
  stop_.Notify();
  thread_.join();
}

std::shared_ptr<StallWatch::Watched> StallWatch::Watch(grpc::ClientContext* call) {
  std::shared_ptr<Watched> watched(new Watched(call, absl::Now()));
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
    const absl::Time cutoff = absl::Now() - idle_;
    std::vector<Watched*> done;
    for (const std::shared_ptr<Watched>& w : watched) {
      if (!w->CancelIfIdleSince(cutoff)) done.push_back(w.get());
    }
    absl::MutexLock lock(&mu_);
    std::erase_if(watched_, [&](const std::shared_ptr<Watched>& w) {
      return std::find(done.begin(), done.end(), w.get()) != done.end();
    });
  }
}

}  // namespace kvtier::prefill
