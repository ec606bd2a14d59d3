// Reading a file that an operator (or Kubernetes, for a mounted Secret)
// replaces while the process runs.
#ifndef KVTIER_SERVICES_BASE_WATCHED_FILE_H_
#define KVTIER_SERVICES_BASE_WATCHED_FILE_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvtier {

// The file's inode, size and modification time: what changes when it is
// rewritten or replaced by a rename. Empty when it cannot be read.
std::string FileSignature(const std::string& path);

// The whole file; INVALID_ARGUMENT "cannot read PATH: why" when it cannot
// be read.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Runs `task` every `every` on a thread of its own (checking watched files
// for changes) until destroyed; the destructor waits for a run under way.
class PeriodicTask {
 public:
  PeriodicTask(absl::Duration every, std::function<void()> task);
  ~PeriodicTask();
  PeriodicTask(const PeriodicTask&) = delete;
  PeriodicTask& operator=(const PeriodicTask&) = delete;

 private:
  const absl::Duration every_;
  const std::function<void()> task_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_WATCHED_FILE_H_
