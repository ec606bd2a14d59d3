// Runs a piece of a test in a child process, for settings that are a
// process's own (malloc's thresholds, CPU affinity, a cgroup): the test's
// process keeps its own.
#ifndef KVTIER_TESTS_IN_CHILD_H_
#define KVTIER_TESTS_IN_CHILD_H_

#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <optional>

namespace kvtier::testing {

// What `work` returns in a forked child; nullopt if the child failed.
inline std::optional<long> InChild(const std::function<long()>& work) {
  int fds[2];
  if (pipe(fds) != 0) return std::nullopt;
  const pid_t pid = fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) {
    close(fds[0]);
    const long result = work();
    _exit(write(fds[1], &result, sizeof result) == sizeof result ? 0 : 3);
  }
  close(fds[1]);
  long result = 0;
  const bool got = read(fds[0], &result, sizeof result) == sizeof result;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return result;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_IN_CHILD_H_
