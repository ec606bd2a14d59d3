// Cancels a call that makes no progress: a decode worker that hangs
// (SIGSTOPped, wedged) keeps its stream open and sends nothing, and the
// client's own deadline may be long or absent. A thread of its own waits
// for Progress() and cancels the call when `idle` passes without one.
#ifndef KVTIER_SERVICES_PREFILL_PROGRESS_WATCHDOG_H_
#define KVTIER_SERVICES_PREFILL_PROGRESS_WATCHDOG_H_

#include <grpcpp/grpcpp.h>

#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvtier::prefill {

class ProgressWatchdog {
 public:
  ProgressWatchdog(grpc::ClientContext* call, absl::Duration idle)
      : call_(call), idle_(idle), last_(absl::Now()), thread_([this] { Watch(); }) {}
  ~ProgressWatchdog() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    thread_.join();
  }
  ProgressWatchdog(const ProgressWatchdog&) = delete;
  ProgressWatchdog& operator=(const ProgressWatchdog&) = delete;

  void Progress() {
    absl::MutexLock lock(&mu_);
    last_ = absl::Now();
  }
  // Whether it cancelled the call.
  bool fired() {
    absl::MutexLock lock(&mu_);
    return fired_;
  }

 private:
  void Watch() {
    absl::MutexLock lock(&mu_);
    while (!done_) {
      const absl::Time due = last_ + idle_;
      if (absl::Now() >= due) {
        fired_ = true;
        call_->TryCancel();
        return;
      }
      mu_.AwaitWithDeadline(absl::Condition(&done_), due);
    }
  }

  grpc::ClientContext* const call_;
  const absl::Duration idle_;
  absl::Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvtier::prefill

#endif  // KVTIER_SERVICES_PREFILL_PROGRESS_WATCHDOG_H_
