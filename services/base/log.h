// A small logging facility: one line a message on stderr, written in one
// call so that lines of several threads (or of a parent printing beside a
// child, as `kvtier up` does) never interleave:
//
//   kvtier-cache: warning: store: a tier move failed (...)
//
// A message that can repeat on every request (a failing disk, a GPU's
// disagreeing CRC) goes through a RateLimitedLog, which says it at most
// once an interval and then how many like it it held back. Thread-safe.
#ifndef KVTIER_SERVICES_BASE_LOG_H_
#define KVTIER_SERVICES_BASE_LOG_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/base/clock.h"

namespace kvtier {

enum class LogLevel { kInfo, kWarning, kError };

// The program name that starts every line ("kvtier" until set); call first
// thing in main.
void SetLogProgram(std::string_view program);

// `component` names the part that speaks (store, disk, fast-path, ...).
void Log(LogLevel level, std::string_view component, std::string_view message);

// One kind of message, said at most once per `every`; the first time at
// once, later ones with the count held back since the last.
class RateLimitedLog {
 public:
  RateLimitedLog(LogLevel level, std::string_view component, absl::Duration every = absl::Minutes(1),
                 Clock* clock = SystemClock::Get())
      : level_(level), component_(component), every_(every), clock_(clock) {}

  void operator()(std::string_view message);

 private:
  const LogLevel level_;
  const std::string component_;
  const absl::Duration every_;
  Clock* const clock_;
  absl::Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t held_back_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_LOG_H_
