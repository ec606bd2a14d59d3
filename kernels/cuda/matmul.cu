// cuBLAS projections and the MoE feed-forward (cuda_matmul.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "cublas_loader.h"
#include "cuda_status.h"
#include "kvtier/kernels/cuda_matmul.h"
#include "kvtier/kernels/expert_groups.h"
#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels::cuda {
namespace {

constexpr int kThreads = 256;

Status BlasError(const CublasApi& api, cublasStatus_t s, const char* what) {
  return Status(StatusCode::kInternal, std::string(what) + ": " + api.status_string(s));
}

unsigned Blocks(size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void ToBf16Kernel(const float* x, uint16_t* out, size_t n) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] = FloatToBf16(x[i]);
}

// out[i] = bf16(x[rows[i]]), one CUDA block per row.
__global__ void GatherBf16Kernel(const float* x, const int32_t* rows, uint32_t cols, uint16_t* out) {
  const float* src = x + size_t(rows[blockIdx.x]) * cols;
  uint16_t* dst = out + size_t{blockIdx.x} * cols;
  for (uint32_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = FloatToBf16(src[c]);
}

// h = bf16(silu(g) * u), as the CPU's SwiGLU (then rounded for the next GEMM).
__global__ void SwiGluKernel(const float* g, const float* u, uint16_t* h, size_t n) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < n) h[i] = FloatToBf16(g[i] / (1.0f + expf(-g[i])) * u[i]);
}

// out[t] = sum of weights[j] * d[pairs[j]] over token t's pairs j (first[t]
// .. first[t + 1] - 1, in group order), one CUDA block per token: every
// output written, each by one thread, in a fixed order.
__global__ void CombineKernel(const float* d, const int32_t* first, const int32_t* pairs, const float* weights,
                              uint32_t cols, float* out) {
  const int32_t begin = first[blockIdx.x], end = first[blockIdx.x + 1];
  float* dst = out + size_t{blockIdx.x} * cols;
  for (uint32_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float sum = 0.0f;
    for (int32_t j = begin; j < end; ++j) sum += weights[j] * d[size_t(pairs[j]) * cols + c];
    dst[c] = sum;
  }
}

// One group's product for SmallGemmKernel: out[r][i] = sum over c of
// x[r][c] * w[i][c], for its rows of x (at most kSmallRows).
struct SmallProduct {
  const uint16_t* w;  // [n][k], bf16
  const uint16_t* x;  // [rows][k], bf16
  float* out;         // [rows][n]
  uint32_t rows, n, k;
};

// Groups of a few rows (a decode step's tokens of one expert) are products
// that only read their weights: one launch for all of them, instead of a
// cuBLAS call each, whose fixed cost is larger than reading an expert.
constexpr uint32_t kSmallRows = Blas::kMaxSmallGroupTokens, kSmallWarps = 8;

// Whether SmallGemmKernel takes it, with groups of at most `most` rows:
// 16-byte loads along whole rows.
bool SmallFits(const SmallProduct& p, uint32_t most) {
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  return p.rows <= most && p.k % 8 == 0 && aligned(p.w) && aligned(p.x);
}

__device__ inline void WidenBf16x8(const uint4 v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  for (uint32_t e = 0; e < 4; ++e) f[2 * e] = Bf16ToFloat(w[e] & 0xffffu), f[2 * e + 1] = Bf16ToFloat(w[e] >> 16);
}

// Grid (tiles of kSmallWarps outputs, products): a warp an output i, each
// lane 8 weights of its row at a time against every row of x, the sums
// joined by shuffles. Float32 sums, as cuBLAS's (in another order).
__global__ void __launch_bounds__(32 * kSmallWarps) SmallGemmKernel(const SmallProduct* products) {
  const SmallProduct p = products[blockIdx.y];
  const uint32_t lane = threadIdx.x % 32, i = blockIdx.x * kSmallWarps + threadIdx.x / 32;
  if (i >= p.n) return;  // the whole warp
  const uint4* w = reinterpret_cast<const uint4*>(p.w + size_t{i} * p.k);
  float acc[kSmallRows] = {};
  for (uint32_t c = lane; c < p.k / 8; c += 32) {
    float wf[8];
    WidenBf16x8(__ldg(w + c), wf);
#pragma unroll
    for (uint32_t r = 0; r < kSmallRows; ++r) {
      if (r < p.rows) {
        float xf[8];
        WidenBf16x8(__ldg(reinterpret_cast<const uint4*>(p.x + size_t{r} * p.k) + c), xf);
        for (uint32_t e = 0; e < 8; ++e) acc[r] = fmaf(wf[e], xf[e], acc[r]);
      }
    }
  }
#pragma unroll
  for (uint32_t r = 0; r < kSmallRows; ++r) {
    float sum = acc[r];
    for (uint32_t d = 16; d > 0; d /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, d);
    if (lane == 0 && r < p.rows) p.out[size_t{r} * p.n + i] = sum;
  }
}

// Appends `values` to `blob` at a multiple of alignof(T); where they start.
template <typename T>
size_t Append(std::vector<uint8_t>& blob, std::span<const T> values) {
  const size_t at = (blob.size() + alignof(T) - 1) / alignof(T) * alignof(T);
  blob.resize(at + values.size_bytes());
  std::memcpy(blob.data() + at, values.data(), values.size_bytes());
  return at;
}

// Scratch slots.
enum Slot : size_t { kXs, kGate, kUp, kHidden, kDown, kRouting, kLogits, kSlots };

}  // namespace

Status Blas::Create(void* stream, std::unique_ptr<Blas>& out) {
  std::string why;
  const CublasApi* api = Cublas(&why);
  if (api == nullptr) return Status(StatusCode::kInternal, "cuda::Blas: " + why);
  cublasHandle_t handle = nullptr;
  if (const cublasStatus_t s = api->create(&handle); s != CUBLAS_STATUS_SUCCESS) {
    return BlasError(*api, s, "cublasCreate");
  }
  if (const cublasStatus_t s = api->set_stream(handle, static_cast<cudaStream_t>(stream)); s != CUBLAS_STATUS_SUCCESS) {
    api->destroy(handle);
    return BlasError(*api, s, "cublasSetStream");
  }
  cudaEvent_t staged = nullptr;
  if (const cudaError_t e = cudaEventCreateWithFlags(&staged, cudaEventDisableTiming); e != cudaSuccess) {
    api->destroy(handle);
    return CudaError(e, "cuda::Blas event");
  }
  out.reset(new Blas(api, handle, stream));
  out->scratch_.assign(kSlots, {nullptr, 0});
  out->staged_ = staged;
  return OkStatus();
}

Blas::~Blas() {
  cudaEventSynchronize(static_cast<cudaEvent_t>(staged_));  // no copy still reads the staging
  cudaEventDestroy(static_cast<cudaEvent_t>(staged_));
  cudaFreeHost(staging_);
  for (auto& [p, bytes] : scratch_) cudaFree(p);
  static_cast<const CublasApi*>(api_)->destroy(static_cast<cublasHandle_t>(handle_));
}

Status Blas::Scratch(size_t slot, size_t bytes, void** out) {
  auto& [p, size] = scratch_[slot];
  if (size < bytes) {
    if (p != nullptr) {
      // Queued work may still use it (cudaFree only "may" wait for that).
      if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return CudaError(e, "cuda::Blas scratch");
      cudaFree(p);
    }
    p = nullptr, size = 0;
    if (const cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) return CudaError(e, "cuda::Blas scratch");
    size = bytes;
  }
  *out = p;
  return OkStatus();
}

Status Blas::Upload(const void* host, size_t bytes, void* device) {
  cudaEvent_t staged = static_cast<cudaEvent_t>(staged_);
  // At once in a forward pass: its stream has waited since the last upload.
  if (const cudaError_t e = cudaEventSynchronize(staged); e != cudaSuccess) return CudaError(e, "cuda::Blas upload");
  if (staging_bytes_ < bytes) {
    cudaFreeHost(staging_);
    staging_ = nullptr, staging_bytes_ = 0;
    if (const cudaError_t e = cudaMallocHost(&staging_, bytes); e != cudaSuccess) {
      return CudaError(e, "cuda::Blas staging");
    }
    staging_bytes_ = bytes;
  }
  std::memcpy(staging_, host, bytes);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  if (const cudaError_t e = cudaMemcpyAsync(device, staging_, bytes, cudaMemcpyHostToDevice, stream);
      e != cudaSuccess) {
    return CudaError(e, "cuda::Blas upload");
  }
  if (const cudaError_t e = cudaEventRecord(staged, stream); e != cudaSuccess) return CudaError(e, "cuda::Blas upload");
  return OkStatus();
}

Status Blas::GemmBf16(const uint16_t* w, uint32_t rows, uint32_t cols, const uint16_t* x, uint32_t n, float* y) {
  return GroupedGemmBf16(w, rows, cols, 1, x, cols, 0, n, y, rows, 0);
}

Status Blas::GroupedGemmBf16(const uint16_t* w, uint32_t rows, uint32_t cols, uint32_t groups, const uint16_t* x,
                             size_t ldx, size_t x_group, uint32_t n, float* y, size_t ldy, size_t y_group) {
  // Row-major W [rows][cols] is column-major W^T; y^T = W x^T in column-major
  // terms: op(A) = W (A = W^T stored, transposed), B = x^T (ld ldx).
  const float one = 1.0f, zero = 0.0f;
  const CublasApi& api = *static_cast<const CublasApi*>(api_);
  const cublasStatus_t s = api.gemm_strided_batched_ex(
      static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n),
      static_cast<int>(cols), &one, w, CUDA_R_16BF, static_cast<int>(cols), static_cast<long long>(rows) * cols, x,
      CUDA_R_16BF, static_cast<int>(ldx), static_cast<long long>(x_group), &zero, y, CUDA_R_32F, static_cast<int>(ldy),
      static_cast<long long>(y_group), static_cast<int>(groups), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? OkStatus() : BlasError(api, s, "cublasGemmStridedBatchedEx");
}

Status Blas::Gemm(const uint16_t* w, uint32_t rows, uint32_t cols, const float* x, uint32_t n, float* y) {
  return GroupedGemm(w, rows, cols, 1, x, cols, 0, n, y, rows, 0);
}

Status Blas::GroupedGemm(const uint16_t* w, uint32_t rows, uint32_t cols, uint32_t groups, const float* x, size_t ldx,
                         size_t x_group, uint32_t n, float* y, size_t ldy, size_t y_group) {
  if (w == nullptr || x == nullptr || y == nullptr || rows == 0 || cols == 0 || groups == 0) {
    return InvalidArgument("cuda::Blas::Gemm: missing pointer or empty matrix");
  }
  if ((groups - 1) * x_group + cols > ldx || (groups - 1) * y_group + rows > ldy) {
    return InvalidArgument("cuda::Blas::GroupedGemm: a group reaches past its row");
  }
  if (n == 0) return OkStatus();
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  void* xs = nullptr;
  KVTIER_KERNELS_RETURN_IF_ERROR(Scratch(kXs, size_t{n} * ldx * 2, &xs));
  ToBf16Kernel<<<Blocks(size_t{n} * ldx), kThreads, 0, stream>>>(x, static_cast<uint16_t*>(xs), size_t{n} * ldx);
  KVTIER_KERNELS_RETURN_IF_ERROR(Launched("cuda::Blas::Gemm"));
  return GroupedGemmBf16(w, rows, cols, groups, static_cast<uint16_t*>(xs), ldx, x_group, n, y, ldy, y_group);
}

Status Blas::MoeForward(const MoeDeviceWeights& w, uint32_t hidden, const float* x, uint32_t n, float* out) {
  const uint32_t experts = static_cast<uint32_t>(w.experts.size());
  if (w.router == nullptr || experts == 0 || x == nullptr || out == nullptr || hidden == 0) {
    return InvalidArgument("cuda::Blas::MoeForward: missing router, experts or pointers");
  }
  if (n == 0) return OkStatus();
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  // The gate: logits on the GPU, the choice on the host with the CPU's own
  // SelectExperts, so both backends route every token the same way.
  void* logits = nullptr;
  KVTIER_KERNELS_RETURN_IF_ERROR(Scratch(kLogits, size_t{n} * experts * 4, &logits));
  KVTIER_KERNELS_RETURN_IF_ERROR(Gemm(w.router, experts, hidden, x, n, static_cast<float*>(logits)));
  std::vector<float> host_logits(size_t{n} * experts);
  if (const cudaError_t e =
          cudaMemcpyAsync(host_logits.data(), logits, host_logits.size() * 4, cudaMemcpyDeviceToHost, stream);
      e != cudaSuccess) {
    return CudaError(e, "cuda::Blas::MoeForward logits");
  }
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    return CudaError(e, "cuda::Blas::MoeForward logits (or work queued before them)");
  }
  std::vector<std::vector<int32_t>> rows_of(experts);
  std::vector<std::vector<float>> weights_of(experts);
  std::vector<ExpertChoice> choices;
  for (uint32_t i = 0; i < n; ++i) {
    KVTIER_KERNELS_RETURN_IF_ERROR(
        SelectExperts(std::span(host_logits).subspan(size_t{i} * experts, experts), w.gate, choices));
    for (const ExpertChoice& c : choices) {
      rows_of[c.expert].push_back(static_cast<int32_t>(i));
      weights_of[c.expert].push_back(c.weight);
    }
  }
  if (w.shared.inter > 0) {
    rows_of.emplace_back(n);
    for (uint32_t i = 0; i < n; ++i) rows_of.back()[i] = static_cast<int32_t>(i);
    weights_of.emplace_back(n, 1.0f);
  }
  std::vector<const SwiGluDeviceWeights*> mlps;
  for (const SwiGluDeviceWeights& e : w.experts) mlps.push_back(&e);
  if (w.shared.inter > 0) mlps.push_back(&w.shared);
  return SwiGluGroups(mlps, rows_of, weights_of, hidden, n, x, out);
}

Status Blas::SwiGluGroups(const std::vector<const SwiGluDeviceWeights*>& mlps,
                          const std::vector<std::vector<int32_t>>& rows, const std::vector<std::vector<float>>& weights,
                          uint32_t hidden, uint32_t tokens, const float* x, float* out) {
  if (tokens == 0) return OkStatus();
  std::vector<uint32_t> inter;
  for (const SwiGluDeviceWeights* m : mlps) inter.push_back(m->inter);
  ExpertGroups plan;
  KVTIER_KERNELS_RETURN_IF_ERROR(PlanExpertGroups(rows, weights, inter, tokens, plan));
  const size_t pairs = plan.pairs();
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  // Every pair's input (bf16), gate and up values, SwiGLU (bf16) and output.
  void *xs, *g, *u, *h, *d;
  KVTIER_KERNELS_RETURN_IF_ERROR(Scratch(kXs, std::max<size_t>(pairs, 1) * hidden * 2, &xs));
  KVTIER_KERNELS_RETURN_IF_ERROR(Scratch(kGate, std::max<size_t>(plan.inner_values, 1) * 4, &g));
  KVTIER_KERNELS_RETURN_IF_ERROR(Scratch(kUp, std::max<size_t>(plan.inner_values, 1) * 4, &u));
  KVTIER_KERNELS_RETURN_IF_ERROR(Scratch(kHidden, std::max<size_t>(plan.inner_values, 1) * 2, &h));
  KVTIER_KERNELS_RETURN_IF_ERROR(Scratch(kDown, std::max<size_t>(pairs, 1) * hidden * 4, &d));
  // Group k's pairs: its inputs, gate and up values, SwiGLU and outputs.
  auto x_of = [&](size_t k) { return static_cast<const uint16_t*>(xs) + plan.first_pair[k] * hidden; };
  auto g_of = [&](size_t k) { return static_cast<float*>(g) + plan.first_inner[k]; };
  auto u_of = [&](size_t k) { return static_cast<float*>(u) + plan.first_inner[k]; };
  auto h_of = [&](size_t k) { return static_cast<const uint16_t*>(h) + plan.first_inner[k]; };
  auto d_of = [&](size_t k) { return static_cast<float*>(d) + plan.first_pair[k] * hidden; };
  // Groups of a few rows go to SmallGemmKernel, one launch a projection
  // for all; the others to cuBLAS, one GEMM a group and projection (its
  // grouped GEMM refuses bf16 inputs with float32 outputs: NOT_SUPPORTED,
  // seen on an H200).
  std::vector<SmallProduct> small_gate_up, small_down;
  std::vector<size_t> large;
  for (size_t k = 0; k < mlps.size(); ++k) {
    if (plan.count[k] == 0) continue;
    const SwiGluDeviceWeights& w = *mlps[k];
    const SmallProduct gate{w.gate, x_of(k), g_of(k), plan.count[k], w.inter, hidden},
        up{w.up, x_of(k), u_of(k), plan.count[k], w.inter, hidden},
        down{w.down, h_of(k), d_of(k), plan.count[k], hidden, w.inter};
    if (SmallFits(gate, small_group_tokens_) && SmallFits(up, small_group_tokens_) &&
        SmallFits(down, small_group_tokens_)) {
      small_gate_up.push_back(gate), small_gate_up.push_back(up), small_down.push_back(down);
    } else {
      large.push_back(k);
    }
  }
  // One copy up: the pairs' tokens, each token's pairs and weights, and the
  // small products.
  std::vector<uint8_t> blob;
  const size_t at_pair_token = Append(blob, std::span<const int32_t>(plan.pair_token));
  const size_t at_first = Append(blob, std::span<const int32_t>(plan.token_first));
  const size_t at_pairs = Append(blob, std::span<const int32_t>(plan.token_pairs));
  const size_t at_weights = Append(blob, std::span<const float>(plan.token_weights));
  const size_t at_gate_up = Append(blob, std::span<const SmallProduct>(small_gate_up));
  const size_t at_down = Append(blob, std::span<const SmallProduct>(small_down));
  void* d_blob;
  KVTIER_KERNELS_RETURN_IF_ERROR(Scratch(kRouting, std::max<size_t>(blob.size(), 1), &d_blob));
  KVTIER_KERNELS_RETURN_IF_ERROR(Upload(blob.data(), blob.size(), d_blob));
  auto in_blob = [&](size_t at) { return static_cast<uint8_t*>(d_blob) + at; };
  const auto launch_small = [&](const std::vector<SmallProduct>& products, size_t at) {
    if (products.empty()) return;
    uint32_t tiles = 0;
    for (const SmallProduct& p : products) tiles = std::max(tiles, (p.n + kSmallWarps - 1) / kSmallWarps);
    SmallGemmKernel<<<dim3(tiles, static_cast<unsigned>(products.size())), 32 * kSmallWarps, 0, stream>>>(
        reinterpret_cast<const SmallProduct*>(in_blob(at)));
  };
  if (pairs > 0) {
    GatherBf16Kernel<<<static_cast<unsigned>(pairs), kThreads, 0, stream>>>(
        x, reinterpret_cast<const int32_t*>(in_blob(at_pair_token)), hidden, static_cast<uint16_t*>(xs));
    launch_small(small_gate_up, at_gate_up);
    for (size_t k : large) {
      const SwiGluDeviceWeights& w = *mlps[k];
      KVTIER_KERNELS_RETURN_IF_ERROR(GemmBf16(w.gate, w.inter, hidden, x_of(k), plan.count[k], g_of(k)));
      KVTIER_KERNELS_RETURN_IF_ERROR(GemmBf16(w.up, w.inter, hidden, x_of(k), plan.count[k], u_of(k)));
    }
    SwiGluKernel<<<Blocks(plan.inner_values), kThreads, 0, stream>>>(static_cast<float*>(g), static_cast<float*>(u),
                                                                     static_cast<uint16_t*>(h), plan.inner_values);
    launch_small(small_down, at_down);
    for (size_t k : large) {
      const SwiGluDeviceWeights& w = *mlps[k];
      KVTIER_KERNELS_RETURN_IF_ERROR(GemmBf16(w.down, hidden, w.inter, h_of(k), plan.count[k], d_of(k)));
    }
  }
  CombineKernel<<<tokens, kThreads, 0, stream>>>(static_cast<const float*>(d),
                                                 reinterpret_cast<const int32_t*>(in_blob(at_first)),
                                                 reinterpret_cast<const int32_t*>(in_blob(at_pairs)),
                                                 reinterpret_cast<const float*>(in_blob(at_weights)), hidden, out);
  return Launched("cuda::Blas SwiGLU");
}

Status Blas::SwiGlu(const SwiGluDeviceWeights& w, uint32_t hidden, const float* x, uint32_t n, float* out) {
  if (w.gate == nullptr || w.up == nullptr || w.down == nullptr || w.inter == 0 || x == nullptr || out == nullptr ||
      hidden == 0) {
    return InvalidArgument("cuda::Blas::SwiGlu: missing weights or pointers");
  }
  if (n == 0) return OkStatus();
  std::vector<std::vector<int32_t>> rows(1, std::vector<int32_t>(n));
  for (uint32_t i = 0; i < n; ++i) rows[0][i] = static_cast<int32_t>(i);
  return SwiGluGroups({&w}, rows, {std::vector<float>(n, 1.0f)}, hidden, n, x, out);
}

}  // namespace kvtier::kernels::cuda
