// DeepSeek-V4's indexer scores and attention with sinks (cuda_v4_attention.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cuda_status.h"
#include "kvtier/kernels/cuda_v4_attention.h"

namespace kvtier::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// The block's maximum or sum of one value a thread (kBlockWarps warps);
// every thread gets it.
template <bool kMax, int kBlockWarps = kWarps>
__device__ float BlockReduce(float v, float* shared) {
  for (int o = 16; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  v = shared[0];
  for (int w = 1; w < kBlockWarps; ++w) v = kMax ? fmaxf(v, shared[w]) : v + shared[w];
  __syncthreads();  // shared is reused by the next reduction
  return v;
}

constexpr int kAttentionThreads = 256;
constexpr int kAttentionWarps = kAttentionThreads / 32;
constexpr uint32_t kMaxAttentionDim = 512;
constexpr uint32_t kPerLane = kMaxAttentionDim / 32;

// One CUDA block per (row, head), a warp per entry at a time, each lane
// holding dims lane + 32 j: the scores (the query in registers), then the
// softmax with the sink, then each warp sums its entries' weighted values
// and the warps' sums are added. Entries go four at a time, so a lane has
// many loads in flight rather than waiting on one an entry.
__global__ void __launch_bounds__(kAttentionThreads)
    SinkAttentionKernel(SinkAttentionShape shape, const float* q, const float* entries, const int64_t* offsets,
                        const int32_t* counts, uint32_t max_count, const float* sinks, float* scratch, float* out) {
  __shared__ float reduced[kAttentionWarps];
  __shared__ float partial[kAttentionWarps][kMaxAttentionDim];
  const uint32_t heads = shape.heads, dim = shape.dim;
  const uint32_t r = blockIdx.x / heads, h = blockIdx.x % heads;
  const size_t row_head = size_t{r} * heads + h;
  const float* qh = q + row_head * dim;
  const float* kv = entries + static_cast<size_t>(offsets[r]) * dim;
  const int32_t m = counts[r];
  float* s = scratch + row_head * max_count;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float query[kPerLane];
#pragma unroll
  for (uint32_t j = 0; j < kPerLane; ++j) query[j] = lane + 32 * j < dim ? qh[lane + 32 * j] : 0.0f;
  float top = -INFINITY;
#pragma unroll 4
  for (int32_t e = warp; e < m; e += kAttentionWarps) {
    const float* entry = kv + size_t(e) * dim;
    float dot = 0.0f;
#pragma unroll
    for (uint32_t j = 0; j < kPerLane; ++j) {
      if (lane + 32 * j < dim) dot += query[j] * entry[lane + 32 * j];
    }
    for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    dot *= shape.scale;
    if (lane == 0) s[e] = dot;
    top = fmaxf(top, dot);
  }
  top = BlockReduce<true, kAttentionWarps>(top, reduced);  // its __syncthreads also publishes s
  float sum = 0.0f;
  for (int32_t e = threadIdx.x; e < m; e += kAttentionThreads) {
    const float p = expf(s[e] - top);
    s[e] = p;
    sum += p;
  }
  sum = BlockReduce<false, kAttentionWarps>(sum, reduced);
  // With no entries top is -inf and the sink's term infinite: out is 0.
  const float denominator = sum + expf(sinks[h] - top);
  float acc[kPerLane] = {};
#pragma unroll 4
  for (int32_t e = warp; e < m; e += kAttentionWarps) {
    const float p = s[e];
    const float* entry = kv + size_t(e) * dim;
#pragma unroll
    for (uint32_t j = 0; j < kPerLane; ++j) {
      if (lane + 32 * j < dim) acc[j] += p * entry[lane + 32 * j];
    }
  }
#pragma unroll
  for (uint32_t j = 0; j < kPerLane; ++j) {
    if (lane + 32 * j < dim) partial[warp][lane + 32 * j] = acc[j];
  }
  __syncthreads();
  float* o = out + row_head * dim;
  for (uint32_t d = threadIdx.x; d < dim; d += kAttentionThreads) {
    float v = 0.0f;
    for (int w = 0; w < kAttentionWarps; ++w) v += partial[w][d];
    o[d] = v / denominator;
  }
}

// The indexer's query of a row in shared memory, at most this many floats
// (heads * dim, then the heads' weights).
constexpr uint32_t kMaxQuery = 12288;
constexpr uint32_t kMaxKeyDim = 512;

// Rows on the grid's y axis; a warp per key, its lanes holding the key's
// values (dim / 32 each) while every head's dot product is summed across
// them.
__global__ void __launch_bounds__(kThreads)
    V4IndexerScoresKernel(uint32_t heads, uint32_t dim, const float* q, const float* weights, const float* keys,
                          const int64_t* key_offsets, const int32_t* visible, uint32_t max_visible, float* scores) {
  extern __shared__ float query[];  // [heads][dim], then [heads] weights
  const uint32_t r = blockIdx.y;
  const uint32_t width = heads * dim;
  for (uint32_t i = threadIdx.x; i < width; i += kThreads) query[i] = q[size_t{r} * width + i];
  for (uint32_t h = threadIdx.x; h < heads; h += kThreads) query[width + h] = weights[size_t{r} * heads + h];
  __syncthreads();
  const int32_t n = visible[r];
  const float* row_keys = keys + static_cast<size_t>(key_offsets[r]) * dim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t per_lane = dim / 32;
  for (int32_t g = blockIdx.x * kWarps + warp; g < n; g += gridDim.x * kWarps) {
    float key[kMaxKeyDim / 32];  // unrolled, so that it stays in registers
#pragma unroll
    for (uint32_t j = 0; j < kMaxKeyDim / 32; ++j) {
      key[j] = j < per_lane ? row_keys[size_t(g) * dim + lane + 32 * j] : 0.0f;
    }
    float score = 0.0f;
    for (uint32_t h = 0; h < heads; ++h) {
      float dot = 0.0f;
#pragma unroll
      for (uint32_t j = 0; j < kMaxKeyDim / 32; ++j) {
        if (j < per_lane) dot += query[h * dim + lane + 32 * j] * key[j];
      }
      for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      score += fmaxf(dot, 0.0f) * query[width + h];
    }
    if (lane == 0) scores[size_t{r} * max_visible + g] = score;
  }
}

}  // namespace

Status V4IndexerScores(uint32_t heads, uint32_t dim, uint32_t rows, const float* q, const float* weights,
                       const float* keys, const int64_t* key_offsets, const int32_t* visible, uint32_t max_visible,
                       float* scores, void* stream) {
  if (q == nullptr || weights == nullptr || keys == nullptr || key_offsets == nullptr || visible == nullptr ||
      scores == nullptr || heads == 0 || dim == 0 || dim % 32 != 0 || dim > kMaxKeyDim ||
      size_t{heads} * dim + heads > kMaxQuery) {
    return InvalidArgument(
        "cuda::V4IndexerScores: missing pointer, or dim not a multiple of 32 up to 512, or a "
        "query of more than 12288 values");
  }
  if (rows == 0 || max_visible == 0) return OkStatus();
  // Each block loads a row's whole query (heads * dim floats), so it
  // scores a run of up to 64 keys rather than one a warp; but a small
  // batch keeps at least about 1,024 blocks, enough warps to hide the
  // latency of each key's shuffles.
  constexpr uint32_t kKeysPerBlock = 64, kEnoughBlocks = 1024;
  const uint32_t by_keys = (max_visible + kKeysPerBlock - 1) / kKeysPerBlock;
  const uint32_t at_most = (max_visible + kWarps - 1) / kWarps;  // one key a warp
  const uint32_t for_occupancy = (kEnoughBlocks + rows - 1) / rows;
  const unsigned tiles =
      static_cast<unsigned>(std::min<uint32_t>(std::max(by_keys, std::min(at_most, for_occupancy)), 4096));
  const size_t shared = (size_t{heads} * dim + heads) * sizeof(float);
  // Rows on the grid's y axis, at most 65535 a launch (a long prefill has more).
  constexpr uint32_t kMaxRows = 65535;
  for (uint32_t first = 0; first < rows; first += kMaxRows) {
    V4IndexerScoresKernel<<<dim3(tiles, std::min(kMaxRows, rows - first)), kThreads, shared,
                            static_cast<cudaStream_t>(stream)>>>(
        heads, dim, q + size_t{first} * heads * dim, weights + size_t{first} * heads, keys, key_offsets + first,
        visible + first, max_visible, scores + size_t{first} * max_visible);
  }
  return Launched("cuda::V4IndexerScores");
}

Status SinkAttention(const SinkAttentionShape& shape, uint32_t rows, const float* q, const float* entries,
                     const int64_t* offsets, const int32_t* counts, uint32_t max_count, const float* sinks,
                     float* scratch, float* out, void* stream) {
  if (q == nullptr || entries == nullptr || offsets == nullptr || counts == nullptr || sinks == nullptr ||
      scratch == nullptr || out == nullptr || shape.heads == 0 || shape.dim == 0 || shape.dim > kMaxAttentionDim) {
    return InvalidArgument("cuda::SinkAttention: missing pointer, or no heads, or dims not 1 to 512");
  }
  if (rows == 0) return OkStatus();
  const size_t blocks = size_t{rows} * shape.heads;
  if (blocks > 0x7fffffffu) return InvalidArgument("cuda::SinkAttention: more rows x heads than one launch takes");
  SinkAttentionKernel<<<static_cast<unsigned>(blocks), kAttentionThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      shape, q, entries, offsets, counts, max_count, sinks, scratch, out);
  return Launched("cuda::SinkAttention");
}

}  // namespace kvtier::kernels::cuda
