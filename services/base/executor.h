// A fixed pool of threads with a bounded queue: where gRPC reactions hand
// their work so that they never block. A full queue refuses new work (the
// caller answers RESOURCE_EXHAUSTED) instead of growing. Thread-safe.
#ifndef KVTIER_SERVICES_BASE_EXECUTOR_H_
#define KVTIER_SERVICES_BASE_EXECUTOR_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace kvtier {

class Executor {
 public:
  Executor(size_t threads, size_t max_queued);
  // Runs what is queued, then joins the threads.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `task`; false (and `task` dropped) when the queue is full or the
  // executor is shutting down.
  [[nodiscard]] bool TrySubmit(std::function<void()> task);

 private:
  void Loop();

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_EXECUTOR_H_
