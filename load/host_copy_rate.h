// The host's copy rate, the physical limit decode benchmarks set their
// steps against: memcpy split over the kernel threads.
#ifndef KVTIER_LOAD_HOST_COPY_RATE_H_
#define KVTIER_LOAD_HOST_COPY_RATE_H_

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "kvtier/kernels/parallel.h"

namespace kvtier::load {

// GB/s of bytes read plus written (as kernels::cuda::DeviceCopyGBs counts),
// the best of 5 after a first: the rate the machine can give, which a
// shared machine's noise only lowers.
inline double HostCopyGBs() {
  constexpr size_t kBytes = size_t{256} << 20;
  std::vector<char> from(kBytes, 1), to(kBytes);  // both touched: no page faults in the timing
  auto copy = [&] {
    kernels::ParallelFor(kBytes, size_t{1} << 20,
                         [&](size_t begin, size_t end) { std::memcpy(&to[begin], &from[begin], end - begin); });
  };
  copy();
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    copy();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * kBytes / seconds / 1e9);
  }
  return best;
}

}  // namespace kvtier::load

#endif  // KVTIER_LOAD_HOST_COPY_RATE_H_
