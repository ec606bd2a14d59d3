// Paged absorbed-MLA decode attention on CUDA cores, in float32: every
// shape, and the tails (float tokens) of the tensor-core kernel's
// (mla_attention_mma.cu); written for correctness, checked against float64
// and the CPU by check_mla_attention.cc.
//
// Grid: (split, head group of up to 16 heads, sequence). A CUDA block walks
// its range of the sequence's blocks 16 tokens at a time: the tokens are
// widened to floats in shared memory (each latent is read from the pool
// once for all of the group's heads: MLA's keys and values are the same
// latent), every (head, token) score is one thread's dot product, an online
// softmax keeps each head's running max and sum, and each thread owns some
// channels of every head's weighted sum. The partial results (max, sum,
// unnormalised sum per head) go to a workspace; a second kernel combines a
// sequence's splits by log-sum-exp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "cuda_status.h"
#include "kvtier/kernels/cuda_mla_attention.h"
#include "kvtier/kernels/float_formats.h"
#include "mla_attention_internal.h"
#include "stream_memory.h"

namespace kvtier::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kGroupHeads = 16;  // heads per CUDA block
constexpr uint32_t kChunk = 16;       // tokens widened at a time

using internal::kBadBlockCount;
using internal::kBadBlockIndex;
using internal::kBadTail;
using internal::Params;
using internal::TableRow;

using internal::StoredValue;

__global__ void __launch_bounds__(kThreads) PartialKernel(Params p) {
  const uint32_t split = p.split_base + blockIdx.x, group = blockIdx.y, b = blockIdx.z;
  const uint32_t kv = p.shape.kv_lora_rank, rope = p.shape.rope_dim, dim = kv + rope, stride = dim + 1;
  const uint32_t h0 = group * kGroupHeads, heads = min(kGroupHeads, p.shape.heads - h0);
  const PagedLatents& L = p.latents;

  extern __shared__ float smem[];
  float* qs = smem;                         // [kGroupHeads][stride]
  float* rows = qs + kGroupHeads * stride;  // [kChunk][stride]
  float* probs = rows + kChunk * stride;    // [kGroupHeads][kChunk]
  float* run_max = probs + kGroupHeads * kChunk;
  float* run_sum = run_max + kGroupHeads;
  float* rescale = run_sum + kGroupHeads;
  float* acc = rescale + kGroupHeads;  // [kGroupHeads][kv]

  const int32_t nblocks = L.blocks_per_sequence[b];
  const int32_t ntail = L.max_tail > 0 ? L.tail_tokens[b] : 0;
  const int64_t table_row = TableRow(L, b);
  if (nblocks < 0 || static_cast<uint32_t>(nblocks) > L.max_blocks_per_sequence || table_row < 0) {
    if (threadIdx.x == 0) NoteBadInput(p.bad, b, kBadBlockCount);
    return;
  }
  const int64_t tail_base = L.tail_offsets != nullptr ? L.tail_offsets[b] : int64_t{b} * L.max_tail;
  if (ntail < 0 || static_cast<uint32_t>(ntail) > L.max_tail || (nblocks == 0 && ntail == 0) ||
      (L.tail_offsets != nullptr && (tail_base < 0 || static_cast<uint64_t>(tail_base) + ntail > L.tail_capacity))) {
    if (threadIdx.x == 0) NoteBadInput(p.bad, b, kBadTail);
    return;
  }

  for (uint32_t i = threadIdx.x; i < heads * dim; i += kThreads) {
    const uint32_t h = i / dim, c = i % dim;
    qs[h * stride + c] = p.q[(size_t{b} * p.shape.heads + h0 + h) * dim + c];
  }
  for (uint32_t i = threadIdx.x; i < heads * kv; i += kThreads) acc[i] = 0.0f;
  if (threadIdx.x < heads) run_max[threadIdx.x] = -INFINITY, run_sum[threadIdx.x] = 0.0f;
  __syncthreads();

  // This split's tokens: its blocks, and the tail (the launch's first
  // split's, or a range of it in a tail-only launch).
  const uint32_t first = blockIdx.x * p.blocks_per_split;
  const uint32_t last = min(first + p.blocks_per_split, static_cast<uint32_t>(nblocks));
  const uint32_t block_tokens = first < last ? (last - first) * L.tokens_per_block : 0;
  uint32_t tail_first = 0, tail_count = blockIdx.x == 0 && p.with_tail ? static_cast<uint32_t>(ntail) : 0;
  if (p.tail_per_split > 0) {
    tail_first = blockIdx.x * p.tail_per_split;
    tail_count = static_cast<uint32_t>(ntail) > tail_first ? min(p.tail_per_split, ntail - tail_first) : 0;
  }
  const uint32_t tokens = block_tokens + tail_count;
  for (uint32_t t0 = 0; t0 < tokens; t0 += kChunk) {
    const uint32_t n = min(kChunk, tokens - t0);
    // Widen n tokens to floats.
    for (uint32_t i = threadIdx.x; i < n * dim; i += kThreads) {
      const uint32_t t = t0 + i / dim, c = i % dim;
      float v;
      if (t < block_tokens) {
        const uint32_t j = first + t / L.tokens_per_block;
        const int32_t index = L.block_table[static_cast<size_t>(table_row) * L.max_blocks_per_sequence + j];
        if (index < 0 || static_cast<uint32_t>(index) >= L.pool_blocks) {
          NoteBadInput(p.bad, b, kBadBlockIndex);
          v = 0.0f;
        } else {
          v = StoredValue(L.codec, L.pool + size_t(index) * p.block_bytes, t % L.tokens_per_block, c, kv, dim, rope);
        }
      } else {
        v = L.tail[(static_cast<size_t>(tail_base) + tail_first + (t - block_tokens)) * dim + c];
      }
      rows[(i / dim) * stride + c] = v;
    }
    __syncthreads();
    // One (head, token) score per thread; the padded stride keeps the
    // lanes' rows in different banks.
    for (uint32_t i = threadIdx.x; i < heads * n; i += kThreads) {
      const uint32_t h = i / n, t = i % n;
      const float* qh = qs + h * stride;
      const float* row = rows + t * stride;
      float dot = 0.0f;
      for (uint32_t c = 0; c < dim; ++c) dot += qh[c] * row[c];
      probs[h * kChunk + t] = dot * p.scale;
    }
    __syncthreads();
    // Online softmax, one thread per head.
    if (threadIdx.x < heads) {
      const uint32_t h = threadIdx.x;
      float m = run_max[h];
      for (uint32_t t = 0; t < n; ++t) m = fmaxf(m, probs[h * kChunk + t]);
      const float r = expf(run_max[h] - m);  // 0 on the first chunk
      float sum = 0.0f;
      for (uint32_t t = 0; t < n; ++t) {
        const float e = expf(probs[h * kChunk + t] - m);
        probs[h * kChunk + t] = e;
        sum += e;
      }
      run_sum[h] = run_sum[h] * r + sum;
      run_max[h] = m;
      rescale[h] = r;
    }
    __syncthreads();
    // Weighted sums: each thread its channels, every head.
    for (uint32_t c = threadIdx.x; c < kv; c += kThreads) {
      float sums[kGroupHeads];
      for (uint32_t h = 0; h < kGroupHeads; ++h) sums[h] = h < heads ? acc[h * kv + c] * rescale[h] : 0.0f;
      for (uint32_t t = 0; t < n; ++t) {
        const float v = rows[t * stride + c];
        for (uint32_t h = 0; h < kGroupHeads; ++h) sums[h] += probs[h * kChunk + t] * v;
      }
      for (uint32_t h = 0; h < heads; ++h) acc[h * kv + c] = sums[h];
    }
    __syncthreads();
  }
  // A split with no tokens writes max -inf and sum 0: it weighs nothing.
  const size_t part = size_t{kv} + 2;
  float* out = p.partial + ((size_t{b} * p.splits + split) * p.shape.heads + h0) * part;
  for (uint32_t h = 0; h < heads; ++h) {
    if (threadIdx.x == 0) out[h * part] = run_max[h], out[h * part + 1] = run_sum[h];
    for (uint32_t c = threadIdx.x; c < kv; c += kThreads) out[h * part + 2 + c] = acc[h * kv + c];
  }
}

// One CUDA block per (head, sequence): the splits' results weighted by
// exp(max_s - max) and normalised by the total sum.
__global__ void __launch_bounds__(kThreads)
    CombineKernel(const float* partial, uint32_t splits, uint32_t heads, uint32_t kv, float* out, float* lse) {
  const uint32_t h = blockIdx.x, b = blockIdx.y;
  const size_t part = size_t{kv} + 2;
  const float* first = partial + (size_t{b} * splits * heads + h) * part;
  const size_t split_stride = size_t{heads} * part;
  float m = -INFINITY;
  for (uint32_t s = 0; s < splits; ++s) m = fmaxf(m, first[s * split_stride]);
  float total = 0.0f;
  for (uint32_t s = 0; s < splits; ++s) total += first[s * split_stride + 1] * expf(first[s * split_stride] - m);
  for (uint32_t c = threadIdx.x; c < kv; c += kThreads) {
    float v = 0.0f;
    for (uint32_t s = 0; s < splits; ++s) {
      v += first[s * split_stride + 2 + c] * expf(first[s * split_stride] - m);
    }
    out[(size_t{b} * heads + h) * kv + c] = v / total;
  }
  if (lse != nullptr && threadIdx.x == 0) lse[size_t{b} * heads + h] = m + logf(total);
}

// What a call needs to know of the current device, asked once a device so
// that a call makes no device queries: its multiprocessors, and the
// dynamic shared memory PartialKernel may use (all the device allows a
// block, set once).
struct DeviceLimits {
  int sms = 0;
  int partial_smem = 0;
};

cudaError_t LimitsOfCurrentDevice(DeviceLimits* out) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mu;
  static std::map<int, DeviceLimits> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(device);
  if (it == known.end()) {
    DeviceLimits limits;
    int optin = 0;
    cudaFuncAttributes partial;
    cudaError_t e = cudaDeviceGetAttribute(&limits.sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&partial, PartialKernel);
    if (e == cudaSuccess) {
      limits.partial_smem = optin - static_cast<int>(partial.sharedSizeBytes);
      e = cudaFuncSetAttribute(PartialKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limits.partial_smem);
    }
    if (e != cudaSuccess) return e;
    it = known.emplace(device, limits).first;
  }
  *out = it->second;
  return cudaSuccess;
}

// How a call splits its work, and the scratch it needs.
struct Plan {
  bool tensor_cores = false;
  uint32_t groups = 0, splits = 0, blocks_per_split = 0, tail_per_split = 0, total_splits = 0;
  size_t smem = 0, block_bytes = 0;
  size_t partial_bytes = 0;    // the partial results
  size_t workspace_bytes = 0;  // and the fault word, unless the caller keeps one
};

Status MakePlan(const MlaShape& shape, const PagedLatents& latents, uint32_t batch, const PagedMlaOptions& options,
                Plan* plan) {
  const uint32_t kv = shape.kv_lora_rank, dim = kv + shape.rope_dim;
  const size_t block_bytes = EncodedBytes(latents.codec, {latents.tokens_per_block, kv, shape.rope_dim});
  if (shape.heads == 0 || kv == 0 || batch == 0 || block_bytes == 0) {
    return InvalidArgument("cuda::PagedMlaDecode: empty shape or batch, or a block shape the codec refuses");
  }
  DeviceLimits limits;
  if (const cudaError_t e = LimitsOfCurrentDevice(&limits); e != cudaSuccess) {
    return CudaError(e, "cuda::PagedMlaDecode");
  }
  const size_t smem = sizeof(float) * ((kGroupHeads + kChunk) * size_t{dim + 1} + kGroupHeads * kChunk +
                                       3 * kGroupHeads + size_t{kGroupHeads} * kv);
  if (smem > static_cast<size_t>(limits.partial_smem)) {
    return InvalidArgument("cuda::PagedMlaDecode: kv_lora_rank + rope_dim " + std::to_string(dim) +
                           " needs more shared memory than the device has");
  }
  // Blocks of V2/V3's shape take the tensor cores; their tails, and
  // everything else, the CUDA-core kernel. With tensor cores the tails are
  // a split of their own.
  const bool tail_only = latents.max_blocks_per_sequence == 0;
  const bool tensor_cores =
      options.tensor_cores && !tail_only && internal::TensorCoreShape(shape, latents, block_bytes);
  // One wave of CUDA blocks over the device (as many as fit at once),
  // splitting long sequences into ranges of whole blocks.
  int per_sm = 2;
  if (tensor_cores) {
    if (const cudaError_t e = internal::TensorCoreBlocksPerSm(latents.codec, &per_sm); e != cudaSuccess) {
      return CudaError(e, "cuda::PagedMlaDecode occupancy");
    }
  }
  const uint32_t groups = (shape.heads + kGroupHeads - 1) / kGroupHeads;
  const uint32_t max_blocks = std::max(latents.max_blocks_per_sequence, 1u);
  const uint32_t wave = static_cast<uint32_t>(std::max(per_sm, 1) * limits.sms);
  const uint32_t wanted = std::max<uint32_t>(1, wave / (batch * groups));  // no partial second wave
  const uint32_t blocks_per_split = (max_blocks + std::min(wanted, max_blocks) - 1) / std::min(wanted, max_blocks);
  uint32_t splits = (max_blocks + blocks_per_split - 1) / blocks_per_split, tail_per_split = 0;
  if (tail_only && latents.max_tail > 0) {  // ranges of whole chunks of the tail
    const uint32_t chunks = (latents.max_tail + kChunk - 1) / kChunk;
    tail_per_split = (chunks + std::min(wanted, chunks) - 1) / std::min(wanted, chunks) * kChunk;
    splits = (latents.max_tail + tail_per_split - 1) / tail_per_split;
  }
  plan->tensor_cores = tensor_cores;
  plan->groups = groups;
  plan->splits = splits;
  plan->blocks_per_split = blocks_per_split;
  plan->tail_per_split = tail_per_split;
  plan->total_splits = splits + (tensor_cores ? 1 : 0);
  plan->smem = smem;
  plan->block_bytes = block_bytes;
  plan->partial_bytes = sizeof(float) * size_t{batch} * plan->total_splits * shape.heads * (size_t{kv} + 2);
  plan->workspace_bytes = plan->partial_bytes + (options.fault == nullptr ? sizeof(unsigned long long) : 0);
  return OkStatus();
}

}  // namespace

size_t PagedMlaWorkspaceBytes(const MlaShape& shape, const PagedLatents& latents, uint32_t batch,
                              const PagedMlaOptions& options) {
  Plan plan;
  return MakePlan(shape, latents, batch, options, &plan).ok() ? plan.workspace_bytes : 0;
}

Status PagedMlaDecode(const MlaShape& shape, const PagedLatents& latents, uint32_t batch, const float* q,
                      float softmax_scale, float* out, float* lse, void* stream_ptr, const PagedMlaOptions& options) {
  if (q == nullptr || out == nullptr || latents.blocks_per_sequence == nullptr ||
      (latents.max_blocks_per_sequence > 0 && (latents.pool == nullptr || latents.block_table == nullptr)) ||
      (latents.max_tail > 0 && (latents.tail == nullptr || latents.tail_tokens == nullptr)) ||
      (latents.tail_offsets != nullptr && latents.tail_capacity == 0) ||
      (latents.block_table_rows != nullptr && latents.block_table_height == 0) ||
      latents.max_blocks_per_sequence + latents.max_tail == 0) {
    return InvalidArgument("cuda::PagedMlaDecode: a pointer is missing for the sizes given");
  }
  Plan plan;
  KVTIER_KERNELS_RETURN_IF_ERROR(MakePlan(shape, latents, batch, options, &plan));
  const uint32_t kv = shape.kv_lora_rank;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  // The partial results, and the fault word unless the caller keeps one:
  // in the caller's workspace, or taken from the stream's pool for the call.
  const bool wait = options.fault == nullptr, own = options.workspace == nullptr;
  void* workspace = options.workspace;
  if (!own && options.workspace_bytes < plan.workspace_bytes) {
    return InvalidArgument("cuda::PagedMlaDecode: a workspace of " + std::to_string(options.workspace_bytes) +
                           " bytes, where the call needs " + std::to_string(plan.workspace_bytes));
  }
  if (own) {
    if (const cudaError_t e = MallocAsync(&workspace, plan.workspace_bytes, stream); e != cudaSuccess) {
      return CudaError(e, "cuda::PagedMlaDecode workspace");
    }
  }
  const auto give_back = [&] {
    if (own) cudaFreeAsync(workspace, stream);
  };
  Params p{
      shape,
      latents,
      plan.block_bytes,
      q,
      softmax_scale,
      plan.total_splits,
      0,
      plan.blocks_per_split,
      !plan.tensor_cores,
      static_cast<float*>(workspace),
      wait ? reinterpret_cast<unsigned long long*>(static_cast<char*>(workspace) + plan.partial_bytes) : options.fault,
      plan.tail_per_split};
  if (wait) cudaMemsetAsync(p.bad, 0xff, sizeof(unsigned long long), stream);
  if (plan.tensor_cores) {
    if (const cudaError_t e = internal::LaunchTensorCorePartials(p, plan.splits, batch, stream); e != cudaSuccess) {
      give_back();
      return CudaError(e, "cuda::PagedMlaDecode tensor-core launch");
    }
    Params tail = p;  // the tails: one split after the blocks' ones
    tail.split_base = plan.splits;
    tail.blocks_per_split = 0;
    tail.with_tail = true;
    PartialKernel<<<dim3(1, plan.groups, batch), kThreads, plan.smem, stream>>>(tail);
  } else {
    PartialKernel<<<dim3(plan.splits, plan.groups, batch), kThreads, plan.smem, stream>>>(p);
  }
  CombineKernel<<<dim3(shape.heads, batch), kThreads, 0, stream>>>(p.partial, plan.total_splits, shape.heads, kv, out,
                                                                   lse);
  unsigned long long bad = kNoPagedMlaFault;
  if (wait) cudaMemcpyAsync(&bad, p.bad, sizeof bad, cudaMemcpyDeviceToHost, stream);
  give_back();
  if (wait) {
    if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
      return CudaError(e, "cuda::PagedMlaDecode");
    }
  }
  KVTIER_KERNELS_RETURN_IF_ERROR(Launched("cuda::PagedMlaDecode launch"));
  return PagedMlaFault(bad);
}

Status PagedMlaFault(unsigned long long fault) {
  if (fault == kNoPagedMlaFault) return OkStatus();
  static const char* const kWhy[] = {
      "", "a block count outside its block-table row (or a block_table_rows entry outside the table)",
      "a block index outside the pool",
      "a tail count outside 0..max_tail (or its tail_offsets outside the tail), or no context"};
  return InvalidArgument("cuda::PagedMlaDecode: sequence " + std::to_string(fault >> 2) + " has " + kWhy[fault & 3]);
}

}  // namespace kvtier::kernels::cuda
