// Buffers the CPU kernels keep per thread between calls. Private to
// kernels/cpu.
#ifndef KVTIER_KERNELS_CPU_SCRATCH_H_
#define KVTIER_KERNELS_CPU_SCRATCH_H_

#include <cstddef>
#include <vector>

namespace kvtier::kernels::cpu {

// `v` grown to at least n elements (new ones zero), never shrunk or
// cleared: a kernel that runs for every layer of every sequence then
// neither allocates nor faults in its memory after its first call.
template <typename T>
T* Sized(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace kvtier::kernels::cpu

#endif  // KVTIER_KERNELS_CPU_SCRATCH_H_
