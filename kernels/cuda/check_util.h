// Helpers the GPU check programs share (plain C++ and cudart; no gtest on
// the device machine).
#ifndef KVTIER_KERNELS_CUDA_CHECK_UTIL_H_
#define KVTIER_KERNELS_CUDA_CHECK_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kvtier/kernels/cuda_codec.h"
#include "kvtier/kernels/cuda_device.h"  // DeviceCopyGBs, the rate the tables compare against

namespace kvtier::kernels::check {

// False when the program was asked for its checks alone (`--no-benchmark`,
// as under compute-sanitizer).
inline bool WantBenchmark(int argc, char** argv) { return !(argc > 1 && std::strcmp(argv[1], "--no-benchmark") == 0); }

// True, having named the device, when there is a GPU to run on; else
// false, having said that `what` was built but not run (the caller exits
// 77: ctest's skip).
inline bool DeviceOrSkip(const char* what) {
  std::string why;
  if (!cuda::DevicePresent(&why)) {
    std::printf("SKIPPED: no GPU (%s); %s built but not run\n", why.c_str(), what);
    return false;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s\n", prop.name);
  return true;
}

// A device copy of `host` (freed by the caller with cudaFree).
template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* d = nullptr;
  cudaMalloc(&d, std::max<size_t>(host.size(), 1) * sizeof(T));
  cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

template <typename T>
std::vector<T> ToHost(const T* d, size_t n) {
  std::vector<T> out(n);
  cudaMemcpy(out.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return out;
}

// Milliseconds per call of `op`, averaged over `reps` after a warm-up.
template <typename Op>
double Milliseconds(Op op, int reps) {
  op();
  cudaDeviceSynchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) op();
  cudaDeviceSynchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / reps;
}

}  // namespace kvtier::kernels::check

#endif  // KVTIER_KERNELS_CUDA_CHECK_UTIL_H_
