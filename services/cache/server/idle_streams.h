// Ends streams that wait on their client for too long. A stream registers
// for as long as it lives; a thread of its own looks at every registered
// stream once a tick and asks each to end itself if it has been idle since
// before now - limit. Without it, a client that opens a Put, sends part of
// a block and stops holds its incomplete blocks (and its share of the
// tenant's bounds) until its own deadline, if it set one.
//
// Lifetime: a stream calls Remove before it is freed; Remove waits while
// the thread is asking that stream, unless Remove runs on that thread
// itself (gRPC may run a reactor's OnDone inline from the Finish that
// ExpireIfIdle calls), in which case the stream must not be touched by
// ExpireIfIdle after its Finish. Thread-safe.
#ifndef KVTIER_SERVICES_CACHE_SERVER_IDLE_STREAMS_H_
#define KVTIER_SERVICES_CACHE_SERVER_IDLE_STREAMS_H_

#include <thread>
#include <unordered_set>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvtier::cache {

class IdleStream {
 public:
  virtual ~IdleStream() = default;
  // Ends the stream if it has waited on its client since before `cutoff`.
  virtual void ExpireIfIdleSince(absl::Time cutoff) = 0;
};

class IdleStreams {
 public:
  // `limit`: how long a stream may wait on its client; checked every
  // limit / 4 (at most every second).
  explicit IdleStreams(absl::Duration limit);
  // Joins the thread; every stream must have been removed.
  ~IdleStreams();
  IdleStreams(const IdleStreams&) = delete;
  IdleStreams& operator=(const IdleStreams&) = delete;

  absl::Duration limit() const { return limit_; }
  void Add(IdleStream* stream);
  void Remove(IdleStream* stream);

 private:
  void Loop();

  const absl::Duration limit_;
  const absl::Duration tick_;
  absl::Mutex mu_;
  absl::CondVar visited_;  // visiting_ went back to null
  std::unordered_set<IdleStream*> streams_ ABSL_GUARDED_BY(mu_);
  IdleStream* visiting_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_SERVER_IDLE_STREAMS_H_
