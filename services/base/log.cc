#include "services/base/log.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

absl::Mutex program_mu(absl::kConstInit);
std::string& Program() ABSL_EXCLUSIVE_LOCKS_REQUIRED(program_mu) {
  static std::string* program = new std::string("kvtier");
  return *program;
}

std::string_view LevelWord(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "";
    case LogLevel::kWarning:
      return "warning: ";
    case LogLevel::kError:
      return "error: ";
  }
  return "";
}

}  // namespace

void SetLogProgram(std::string_view program) {
  absl::MutexLock lock(&program_mu);
  Program() = std::string(program);
}

void Log(LogLevel level, std::string_view component, std::string_view message) {
  std::string line;
  {
    absl::MutexLock lock(&program_mu);
    line = Program() + ": ";
  }
  line.append(LevelWord(level)).append(component).append(component.empty() ? "" : ": ").append(message) += '\n';
  // One write(2): lines never interleave, and stderr's buffering is moot.
  for (std::string_view left = line; !left.empty();) {
    const ssize_t n = write(STDERR_FILENO, left.data(), left.size());
    if (n <= 0) break;
    left.remove_prefix(static_cast<size_t>(n));
  }
}

void RateLimitedLog::operator()(std::string_view message) {
  uint64_t held_back = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    if (now - last_ < every_) {
      ++held_back_;
      return;
    }
    last_ = now;
    held_back = held_back_;
    held_back_ = 0;
  }
  if (held_back == 0) {
    Log(level_, component_, message);
  } else {
    Log(level_, component_,
        std::string(message) + absl::StrCat(" (and ", held_back, " more like it since it was last said)"));
  }
}

}  // namespace kvtier
