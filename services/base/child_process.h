// Starts a real binary (kvtier up, integration tests, benchmarks) and reads
// what it prints: servers announce "listening on HOST:PORT" on stdout, so
// callers wait for that line instead of sleeping.
#ifndef KVTIER_SERVICES_BASE_CHILD_PROCESS_H_
#define KVTIER_SERVICES_BASE_CHILD_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace kvtier {

class ChildProcess {
 public:
  // fork + exec `argv` with stdout on a pipe; stderr goes to ours. The
  // child gets SIGKILL if this process dies.
  explicit ChildProcess(std::vector<std::string> argv);
  ~ChildProcess();  // SIGKILLs the child if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The next stdout line starting with `prefix`, without it; nullopt if the
  // child closes stdout or `timeout_ms` passes first.
  std::optional<std::string> WaitForLine(const std::string& prefix, int timeout_ms = 30000);
  // True once the child closed its stdout (it exited, most likely).
  bool output_closed() const { return output_closed_; }
  // The port of "listening on HOST:PORT" (-1 if not printed in time).
  int WaitForListeningPort(int timeout_ms = 30000);
  // Sends `signal`, waits for exit; returns the exit code (128 + signal if
  // killed by one), or -1 if it did not exit within `timeout_ms`.
  int Stop(int signal, int timeout_ms = 30000);
  // Its resident memory of its own and in shared memory (RssAnon +
  // RssShmem), without the library files it maps (shared with every
  // process that loads them); 0 if unreadable.
  size_t OwnAndSharedRssBytes() const;

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  bool output_closed_ = false;
};

// A loopback TCP port free right now, for servers that cannot bind port 0
// and report it (Prometheus, Redis); 0 when the system gives none.
int FreeLoopbackPort();

// Runs a command to completion; stdout and stderr together.
struct CommandResult {
  int exit_code;
  std::string output;
};
CommandResult RunCommand(const std::string& command);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_CHILD_PROCESS_H_
