// Just enough of CUDA, on the CPU, to run the codec kernels of
// kernels/cuda/codec_kernels.cuh where no GPU is: one std::thread per
// thread of a CUDA block, the CUDA blocks of a launch one after another.
// __shared__ becomes a function-local static (shared by a block's threads,
// and blocks never overlap), __syncthreads a barrier of the block,
// __shfl_xor_sync an exchange through memory between two barriers of the
// warp, and the rounded float intrinsics the host's IEEE operations
// (compile without FMA contraction, as nvcc compiles codec.cu). It checks
// the kernels' logic (indexing, groups, the bytes), not their speed or
// their memory model. Include before codec_kernels.cuh.
#ifndef KVTIER_TESTS_KERNELS_CUDA_EMULATION_H_
#define KVTIER_TESTS_KERNELS_CUDA_EMULATION_H_

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

struct dim3 {
  uint32_t x, y, z;
  dim3(uint32_t x_ = 1, uint32_t y_ = 1, uint32_t z_ = 1) : x(x_), y(y_), z(z_) {}  // NOLINT: CUDA's implicit form
};
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
struct uint2 {
  uint32_t x, y;
};
struct uint4 {
  uint32_t x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)
#define __shared__ static

namespace kvtier::testing::cuda_emulation {

inline thread_local dim3 thread_index, block_index;
inline dim3 block_dim;
inline std::barrier<>* block_barrier = nullptr;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline std::vector<float> shuffled;
inline std::mutex atomics;

// Runs kernel(args...) over `grid` CUDA blocks of `block` threads (x only):
// each thread runs its part of every CUDA block in turn, and a block starts
// when every thread is done with the one before (its shared memory is the
// next one's).
template <typename Kernel, typename... Args>
void Launch(dim3 grid, dim3 block, Kernel kernel, Args... args) {
  block_dim = block;
  const uint32_t n = block.x;
  shuffled.assign(n, 0.0f);
  std::barrier<> in_block(n), between_blocks(n);
  block_barrier = &in_block;
  warp_barriers.clear();
  for (uint32_t w = 0; 32 * w < n; ++w)
    warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(32u, n - 32 * w)));
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      thread_index = dim3(t);
      for (uint32_t z = 0; z < grid.z; ++z) {
        for (uint32_t y = 0; y < grid.y; ++y) {
          for (uint32_t x = 0; x < grid.x; ++x) {
            block_index = dim3(x, y, z);
            kernel(args...);
            between_blocks.arrive_and_wait();
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace kvtier::testing::cuda_emulation

#define threadIdx (::kvtier::testing::cuda_emulation::thread_index)
#define blockIdx (::kvtier::testing::cuda_emulation::block_index)
#define blockDim (::kvtier::testing::cuda_emulation::block_dim)

inline void __syncthreads() { kvtier::testing::cuda_emulation::block_barrier->arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned /*mask*/, float value, int lane_mask) {
  namespace emu = kvtier::testing::cuda_emulation;
  const uint32_t t = emu::thread_index.x;
  emu::shuffled[t] = value;
  emu::warp_barriers[t / 32]->arrive_and_wait();
  const float other = emu::shuffled[t ^ static_cast<uint32_t>(lane_mask)];
  emu::warp_barriers[t / 32]->arrive_and_wait();
  return other;
}

inline unsigned long long atomicMin(unsigned long long* address, unsigned long long value) {
  std::lock_guard<std::mutex> lock(kvtier::testing::cuda_emulation::atomics);
  const unsigned long long old = *address;
  *address = std::min(old, value);
  return old;
}

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
using std::isfinite;
using std::min;

#endif  // KVTIER_TESTS_KERNELS_CUDA_EMULATION_H_
