// The one way tests wait for what only another process can make true and
// announces nowhere (a server's Stats, a metric, a Prometheus query): ask
// again, backing off from 5 ms to 200 ms, until it holds or `timeout`
// passes. A condition inside the test's own process is waited on itself
// (absl::Mutex::Await), never polled.
#ifndef KVTIER_TESTS_EVENTUALLY_H_
#define KVTIER_TESTS_EVENTUALLY_H_

#include <algorithm>
#include <chrono>
#include <thread>

namespace kvtier::testing {

template <typename Holds>
bool Eventually(Holds holds, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::milliseconds pause(5);
  while (true) {
    if (holds()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_EVENTUALLY_H_
