// Dense projections and the MoE feed-forward on the GPU through cuBLAS:
// bf16 weights (a checkpoint's own dtype, row-major [out][in] as Hugging
// Face stores them), activations rounded to bf16 on the way in, products
// summed in float32 (CUBLAS_COMPUTE_32F), results in float32. The MoE gate
// picks experts exactly as the CPU does (SelectExperts, on the gate's
// logits); each chosen expert then runs once over all of its tokens, its
// (token, expert) pairs laid out together (expert_groups.h), experts with a
// few tokens (a decode step's) all in one launch a projection, and each
// token sums its experts' outputs in one pass.
// Built only with CUDA; callable from plain C++. Not thread-safe (one
// stream, reused scratch memory).
//
// Each call queues its work on the Blas's stream and returns without
// waiting (MoeForward waits once, for the gate's logits): the caller waits
// before reading results, and a fault while the work runs shows at that
// wait. Host memory given to a call may go when it returns.
#ifndef KVTIER_KERNELS_CUDA_MATMUL_H_
#define KVTIER_KERNELS_CUDA_MATMUL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/status.h"

namespace kvtier::kernels::cuda {

// One SwiGLU MLP's weights in device memory, bf16 (uint16_t bits).
struct SwiGluDeviceWeights {
  const uint16_t* gate = nullptr;  // [inter][hidden]
  const uint16_t* up = nullptr;    // [inter][hidden]
  const uint16_t* down = nullptr;  // [hidden][inter]
  uint32_t inter = 0;
};

struct MoeDeviceWeights {
  const uint16_t* router = nullptr;          // [experts][hidden]
  std::vector<SwiGluDeviceWeights> experts;  // routed
  SwiGluDeviceWeights shared;                // inter 0: none
  GateParams gate;
};

class Blas {
 public:
  // A cuBLAS handle on `stream` (a cudaStream_t; null: the default stream).
  // cuBLAS is opened here, the first time (INTERNAL when it cannot be).
  static Status Create(void* stream, std::unique_ptr<Blas>& out);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // y[i][r] = sum_c w[r][c] * x[i][c] for n inputs: w bf16 [rows][cols], x
  // and y float [n][cols] and [n][rows], all device memory.
  Status Gemm(const uint16_t* w, uint32_t rows, uint32_t cols, const float* x, uint32_t n, float* y);

  // Gemm for `groups` weights at once (w_g = w + g * rows * cols), each over
  // its own columns of the same rows: y_g[i] = w_g x_g[i], with x_g[i] at
  // x + i * ldx + g * x_group and y_g[i] at y + i * ldy + g * y_group (per
  // head projections straight from and into [n][heads][...] activations).
  // Every group must lie within its row: (groups - 1) * x_group + cols <= ldx,
  // likewise for y.
  Status GroupedGemm(const uint16_t* w, uint32_t rows, uint32_t cols, uint32_t groups, const float* x, size_t ldx,
                     size_t x_group, uint32_t n, float* y, size_t ldy, size_t y_group);

  // out[n][hidden] = SwiGLU(x) (a dense layer's MLP), x and out device
  // memory.
  Status SwiGlu(const SwiGluDeviceWeights& w, uint32_t hidden, const float* x, uint32_t n, float* out);

  // out[n][hidden] = routed experts (weighted by the gate) + shared experts,
  // x and out device memory.
  Status MoeForward(const MoeDeviceWeights& w, uint32_t hidden, const float* x, uint32_t n, float* out);

  // MoeForward's experts with at most this many tokens (a decode step's)
  // run in one launch for all a projection, the others a cuBLAS GEMM each.
  static constexpr uint32_t kMaxSmallGroupTokens = 8;
  // Lowers that bound (0: every expert to cuBLAS), for benchmarks to
  // compare the two.
  void SetSmallGroupTokens(uint32_t tokens) { small_group_tokens_ = std::min(tokens, kMaxSmallGroupTokens); }

 private:
  Blas(const void* api, void* handle, void* stream) : api_(api), handle_(handle), stream_(stream) {}
  // y = x W^T on bf16 x already on the device (grouped: as GroupedGemm).
  Status GemmBf16(const uint16_t* w, uint32_t rows, uint32_t cols, const uint16_t* x, uint32_t n, float* y);
  Status GroupedGemmBf16(const uint16_t* w, uint32_t rows, uint32_t cols, uint32_t groups, const uint16_t* x,
                         size_t ldx, size_t x_group, uint32_t n, float* y, size_t ldy, size_t y_group);
  // Device scratch of at least `bytes`, kept between calls.
  Status Scratch(size_t slot, size_t bytes, void** out);
  // Queues a copy of `bytes` host bytes to `device` through pinned staging
  // (refilled once the last such copy has run), so `host` may go at once.
  Status Upload(const void* host, size_t bytes, void* device);
  // out[t] = sum over groups g of weights[g][i] * mlps[g](x[t]) for each
  // i with rows[g][i] = t, for `tokens` tokens (host lists rows and weights).
  Status SwiGluGroups(const std::vector<const SwiGluDeviceWeights*>& mlps,
                      const std::vector<std::vector<int32_t>>& rows, const std::vector<std::vector<float>>& weights,
                      uint32_t hidden, uint32_t tokens, const float* x, float* out);

  const void* api_;  // the CublasApi (cuBLAS is opened at run time: cublas_loader.h)
  void* handle_;     // cublasHandle_t
  void* stream_;     // cudaStream_t
  std::vector<std::pair<void*, size_t>> scratch_;
  void* staging_ = nullptr;  // pinned, for Upload
  size_t staging_bytes_ = 0;
  void* staged_ = nullptr;  // cudaEvent_t: the last Upload's copy has run
  uint32_t small_group_tokens_ = kMaxSmallGroupTokens;
};

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_MATMUL_H_
