// Cancels calls that make no progress: a decode worker that hangs
// (SIGSTOPped, wedged) keeps its stream open and sends nothing, and the
// client's own deadline may be long or absent. One thread watches every
// call, looking a few times per `idle`, and cancels a call once `idle` has
// passed without Progress().
#ifndef KVTIER_SERVICES_PREFILL_STALL_WATCH_H_
#define KVTIER_SERVICES_PREFILL_STALL_WATCH_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace kvtier::prefill {

class StallWatch {
 public:
  // One call's watch: Progress() as it makes some; Stop() when it ends.
  // Thread-safe.
  class Watched {
   public:
    void Progress();
    // Whether the watch cancelled the call.
    bool fired();
    void Stop();

   private:
    friend class StallWatch;
    Watched(std::weak_ptr<void> owner, grpc::ClientContext* call, absl::Time now)
        : owner_(std::move(owner)), call_(call), last_(now) {}
    // Cancels the call if it has been idle since before `cutoff`. Outside
    // mu_, its owner held: cancelling may end the call at once, inline.
    void CancelIfIdleSince(absl::Time cutoff);
    // Stopped or fired: nothing more to watch.
    bool over();

    const std::weak_ptr<void> owner_;  // keeps call_ alive while it is cancelled
    grpc::ClientContext* const call_;
    absl::Mutex mu_;
    absl::Time last_ ABSL_GUARDED_BY(mu_);
    bool fired_ ABSL_GUARDED_BY(mu_) = false;
    bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  };

  explicit StallWatch(absl::Duration idle);
  ~StallWatch();
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // Watches `call`, which `owner` keeps alive, from now until the Watched
  // is stopped.
  std::shared_ptr<Watched> Watch(std::weak_ptr<void> owner, grpc::ClientContext* call);

 private:
  void Loop();

  const absl::Duration idle_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Watched>> watched_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace kvtier::prefill

#endif  // KVTIER_SERVICES_PREFILL_STALL_WATCH_H_
