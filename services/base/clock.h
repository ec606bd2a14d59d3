// Time source for logic that expires things (leases), injected so tests can
// drive it by hand instead of sleeping.
#ifndef KVTIER_SERVICES_BASE_CLOCK_H_
#define KVTIER_SERVICES_BASE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvtier {

// Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
};

class SystemClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  static Clock* Get() {
    static SystemClock clock;
    return &clock;
  }
};

// Moves only when told to.
class ManualClock : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24 * 365 * 50)) : now_(start) {}
  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_CLOCK_H_
