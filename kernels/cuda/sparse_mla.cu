// DeepSeek-V3.2's indexer scores, top-k choice and latent gather on the
// GPU. FMA contraction is off for this file, so a score is added up in the
// stated order; a gathered latent is StoredValue's, the bits the CPU
// decodes.
#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>
#include <string>

#include "cuda_status.h"
#include "kvtier/kernels/cuda_sparse_mla.h"
#include "kvtier/kernels/float_formats.h"
#include "mla_attention_internal.h"

namespace kvtier::kernels::cuda {
namespace {

using internal::NoteBadInput;

constexpr uint32_t kScoreThreads = 128;  // tokens a CUDA block scores
constexpr int kSelectThreads = 1024;
constexpr uint32_t kGatherThreads = 128;

// One thread per token: its key widened into registers, then every head's
// dot product with the row's query (shared, read four values at a time).
template <uint32_t kDim>
__global__ void __launch_bounds__(kScoreThreads)
    ScoresKernel(uint32_t heads, const uint8_t* q_codes, const float* weights, IndexerKeys keys, float* scores) {
  extern __shared__ float4 shared4[];
  float* q = reinterpret_cast<float*>(shared4);  // [heads][kDim]
  float* w = q + size_t{heads} * kDim;           // [heads]
  const uint32_t r = blockIdx.y, t = blockIdx.x * kScoreThreads + threadIdx.x;
  for (uint32_t i = threadIdx.x; i < heads * kDim; i += kScoreThreads) {
    q[i] = Fp8E4m3ToFloat(q_codes[size_t{r} * heads * kDim + i]);
  }
  for (uint32_t h = threadIdx.x; h < heads; h += kScoreThreads) w[h] = weights[size_t{r} * heads + h];
  __syncthreads();
  if (t >= static_cast<uint32_t>(keys.visible[r])) return;
  const size_t key = static_cast<size_t>(keys.key_offsets[r]) + t;
  float k[kDim];
  const uint4* packed = reinterpret_cast<const uint4*>(keys.codes + key * kDim);
#pragma unroll
  for (uint32_t j = 0; j < kDim / 16; ++j) {
    const uint4 v = packed[j];
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (uint32_t b = 0; b < 16; ++b)
      k[16 * j + b] = Fp8E4m3ToFloat(static_cast<uint8_t>(words[b / 4] >> (8 * (b % 4))));
  }
  float sum = 0.0f;
  for (uint32_t h = 0; h < heads; ++h) {
    const float4* qh = reinterpret_cast<const float4*>(q + size_t{h} * kDim);
    float dot = 0.0f;
#pragma unroll
    for (uint32_t d = 0; d < kDim / 4; ++d) {
      const float4 a = qh[d];
      dot = dot + a.x * k[4 * d];
      dot = dot + a.y * k[4 * d + 1];
      dot = dot + a.z * k[4 * d + 2];
      dot = dot + a.w * k[4 * d + 3];
    }
    sum = sum + w[h] * fmaxf(dot, 0.0f);
  }
  scores[size_t{r} * keys.max_visible + t] = keys.scales[key] * sum;
}

// Scores as unsigned keys in the same order (-0 as +0).
__device__ inline uint32_t OrderedBits(float score) {
  const uint32_t u = __float_as_uint(score + 0.0f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// One CUDA block per row: the k-th largest key found a byte at a time
// (radix select), then the tokens above it and the first ones equal to it
// written out in token order.
__global__ void __launch_bounds__(kSelectThreads)
    SelectKernel(const float* scores, uint32_t max_visible, const int32_t* visible, uint32_t k, int32_t* selected,
                 int32_t* counts) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ uint32_t histogram[256];
  __shared__ uint32_t chosen_prefix, chosen_wanted;
  const uint32_t r = blockIdx.x;
  const float* s = scores + size_t{r} * max_visible;
  const uint32_t n = min(static_cast<uint32_t>(max(visible[r], 0)), max_visible);
  int32_t* out = selected + size_t{r} * k;
  if (n <= k) {
    for (uint32_t i = threadIdx.x; i < n; i += kSelectThreads) out[i] = static_cast<int32_t>(i);
    if (threadIdx.x == 0) counts[r] = static_cast<int32_t>(n);
    return;
  }
  // prefix: the high bytes of the k-th largest key found so far; wanted:
  // how many keys with that prefix still belong to the top k.
  uint32_t prefix = 0, mask = 0, wanted = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (uint32_t d = threadIdx.x; d < 256; d += kSelectThreads) histogram[d] = 0;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n; i += kSelectThreads) {
      const uint32_t u = OrderedBits(s[i]);
      if ((u & mask) == prefix) atomicAdd(&histogram[(u >> shift) & 0xffu], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t above = 0;
      for (int d = 255; d >= 0; --d) {
        if (above + histogram[d] >= wanted) {
          chosen_prefix = prefix | (static_cast<uint32_t>(d) << shift);
          chosen_wanted = wanted - above;
          break;
        }
        above += histogram[d];
      }
    }
    __syncthreads();
    prefix = chosen_prefix, wanted = chosen_wanted;
    mask |= 0xffu << shift;
  }
  // Every key above `prefix` (the k-th largest) and the first `wanted`
  // equal to it, in token order.
  int written = 0, equal_seen = 0;
  for (uint32_t base = 0; base < n; base += kSelectThreads) {
    const uint32_t i = base + threadIdx.x;
    const uint32_t u = i < n ? OrderedBits(s[i]) : 0;
    const bool equal = i < n && u == prefix;
    int equal_rank = 0, equal_count = 0;
    Scan(scan).ExclusiveSum(equal ? 1 : 0, equal_rank, equal_count);
    __syncthreads();
    const bool take = (i < n && u > prefix) || (equal && equal_seen + equal_rank < static_cast<int>(wanted));
    int position = 0, taken = 0;
    Scan(scan).ExclusiveSum(take ? 1 : 0, position, taken);
    __syncthreads();
    if (take) out[written + position] = static_cast<int32_t>(i);
    written += taken, equal_seen += equal_count;
  }
  if (threadIdx.x == 0) counts[r] = static_cast<int32_t>(k);
}

// Where chosen token t of row r lies: its block (and its place in it) or
// its tail row; `bad` (noted in `fault`) when it lies outside its
// sequence or the pool.
struct ChosenToken {
  const uint8_t* block = nullptr;
  const float* tail = nullptr;
  uint32_t in_block = 0;
  bool bad = false;
};

__device__ ChosenToken FindChosen(const PagedLatents& L, size_t block_bytes, uint32_t dim, uint32_t r, int32_t t,
                                  unsigned long long* fault) {
  ChosenToken c;
  const int32_t nblocks = L.blocks_per_sequence[r];
  const int64_t table_row = internal::TableRow(L, r);
  const int64_t sealed = int64_t{nblocks} * L.tokens_per_block;
  c.bad = t < 0 || nblocks < 0 || static_cast<uint32_t>(nblocks) > L.max_blocks_per_sequence || table_row < 0;
  if (!c.bad && t < sealed) {
    const int32_t index = L.block_table[static_cast<size_t>(table_row) * L.max_blocks_per_sequence +
                                        static_cast<uint32_t>(t) / L.tokens_per_block];
    c.bad = index < 0 || static_cast<uint32_t>(index) >= L.pool_blocks;
    if (c.bad && threadIdx.x == 0) NoteBadInput(fault, r, internal::kBadBlockIndex);
    if (!c.bad) c.block = L.pool + static_cast<size_t>(index) * block_bytes;
  } else if (!c.bad) {
    const int64_t j = t - sealed;
    const int64_t base = L.tail_offsets != nullptr ? L.tail_offsets[r] : int64_t{r} * L.max_tail;
    c.bad = L.max_tail == 0 || j >= L.tail_tokens[r] || base < 0 ||
            (L.tail_offsets != nullptr && static_cast<uint64_t>(base + j) >= L.tail_capacity);
    if (c.bad && threadIdx.x == 0) NoteBadInput(fault, r, internal::kBadTail);
    if (!c.bad) c.tail = L.tail + static_cast<size_t>(base + j) * dim;
  } else if (threadIdx.x == 0) {
    NoteBadInput(fault, r, internal::kBadBlockCount);
  }
  c.in_block = static_cast<uint32_t>(t) % max(L.tokens_per_block, 1u);
  return c;
}

// Value c of a chosen token: the bits the CPU decodes; 0 for a bad one.
__device__ float ChosenValue(const ChosenToken& t, const PagedLatents& L, uint32_t c, uint32_t kv, uint32_t rope) {
  const uint32_t dim = kv + rope;
  return t.bad               ? 0.0f
         : t.tail != nullptr ? t.tail[c]
                             : internal::StoredValue(L.codec, t.block, t.in_block, c, kv, dim, rope);
}

// One CUDA block per chosen token: its row of the output.
__global__ void __launch_bounds__(kGatherThreads)
    GatherKernel(MlaShape shape, PagedLatents L, size_t block_bytes, const int32_t* selected, uint32_t k,
                 const int32_t* counts, float* out, unsigned long long* fault) {
  const uint32_t i = blockIdx.x, r = blockIdx.y;
  const uint32_t kv = shape.kv_lora_rank, rope = shape.rope_dim, dim = kv + rope;
  if (i >= static_cast<uint32_t>(counts[r])) return;
  float* row = out + (size_t{r} * k + i) * dim;
  const ChosenToken t = FindChosen(L, block_bytes, dim, r, selected[size_t{r} * k + i], fault);
  for (uint32_t c = threadIdx.x; c < dim; c += kGatherThreads) row[c] = ChosenValue(t, L, c, kv, rope);
}

// GatherKernel's values laid out as GatherLatentBlocks says; the first
// CUDA block of a row also writes the row's block table, block count and
// tail count.
__global__ void __launch_bounds__(kGatherThreads)
    GatherBlocksKernel(MlaShape shape, PagedLatents L, size_t block_bytes, const int32_t* selected, uint32_t k,
                       const int32_t* counts, GatheredLatents out, unsigned long long* fault) {
  const uint32_t i = blockIdx.x, r = blockIdx.y;
  const uint32_t kv = shape.kv_lora_rank, rope = shape.rope_dim, dim = kv + rope;
  const uint32_t per_block = kGatheredBlockTokens, max_blocks = k / per_block;
  const uint32_t count = static_cast<uint32_t>(max(counts[r], 0));
  const uint32_t full = min(count / per_block, max_blocks);
  if (i == 0) {
    for (uint32_t j = threadIdx.x; j < max_blocks; j += kGatherThreads) {
      out.block_table[size_t{r} * max_blocks + j] = static_cast<int32_t>(r * max_blocks + j);
    }
    if (threadIdx.x == 0) {
      out.blocks[r] = static_cast<int32_t>(full);
      out.tail_tokens[r] = static_cast<int32_t>(min(count, k) - full * per_block);
    }
  }
  if (i >= count) return;
  const ChosenToken t = FindChosen(L, block_bytes, dim, r, selected[size_t{r} * k + i], fault);
  if (i < full * per_block) {
    uint16_t* row =
        reinterpret_cast<uint16_t*>(out.pool + (size_t{r} * max_blocks + i / per_block) * GatheredBlockBytes(shape)) +
        size_t{i % per_block} * dim;
    for (uint32_t c = threadIdx.x; c < dim; c += kGatherThreads) row[c] = FloatToBf16(ChosenValue(t, L, c, kv, rope));
  } else {
    float* row = out.tail + (size_t{r} * per_block + (i - full * per_block)) * dim;
    for (uint32_t c = threadIdx.x; c < dim; c += kGatherThreads) row[c] = ChosenValue(t, L, c, kv, rope);
  }
}

template <uint32_t kDim>
cudaError_t LaunchScores(uint32_t heads, uint32_t rows, const uint8_t* q_codes, const float* weights,
                         const IndexerKeys& keys, float* scores, cudaStream_t stream) {
  const size_t smem = sizeof(float) * size_t{heads} * (kDim + 1);
  if (const cudaError_t e =
          cudaFuncSetAttribute(ScoresKernel<kDim>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      e != cudaSuccess) {
    return e;
  }
  const dim3 grid((keys.max_visible + kScoreThreads - 1) / kScoreThreads, rows);
  ScoresKernel<kDim><<<grid, kScoreThreads, smem, stream>>>(heads, q_codes, weights, keys, scores);
  return cudaGetLastError();
}

}  // namespace

Status IndexerScores(uint32_t heads, uint32_t head_dim, uint32_t rows, const uint8_t* q_codes, const float* weights,
                     const IndexerKeys& keys, float* scores, void* stream_ptr) {
  if (rows == 0 || keys.max_visible == 0) return Status();
  if (heads == 0 || heads > 1024 || rows > 65535) {
    return InvalidArgument("cuda::IndexerScores: " + std::to_string(heads) + " heads and " + std::to_string(rows) +
                           " rows (1..1024 heads, at most 65535 rows)");
  }
  if (q_codes == nullptr || weights == nullptr || keys.codes == nullptr || keys.scales == nullptr ||
      keys.key_offsets == nullptr || keys.visible == nullptr || scores == nullptr) {
    return InvalidArgument("cuda::IndexerScores: a pointer is missing");
  }
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  cudaError_t e;
  switch (head_dim) {
    case 16:
      e = LaunchScores<16>(heads, rows, q_codes, weights, keys, scores, stream);
      break;
    case 32:
      e = LaunchScores<32>(heads, rows, q_codes, weights, keys, scores, stream);
      break;
    case 64:
      e = LaunchScores<64>(heads, rows, q_codes, weights, keys, scores, stream);
      break;
    case 128:
      e = LaunchScores<128>(heads, rows, q_codes, weights, keys, scores, stream);
      break;
    default:
      return InvalidArgument("cuda::IndexerScores: head_dim " + std::to_string(head_dim) +
                             " (the kernel takes 16, 32, 64 or 128)");
  }
  return e == cudaSuccess ? Status() : CudaError(e, "cuda::IndexerScores launch");
}

Status SelectTopTokens(uint32_t rows, const float* scores, uint32_t max_visible, const int32_t* visible, uint32_t k,
                       int32_t* selected, int32_t* counts, void* stream_ptr) {
  if (rows == 0) return Status();
  if (k == 0 || scores == nullptr || visible == nullptr || selected == nullptr || counts == nullptr) {
    return InvalidArgument("cuda::SelectTopTokens: k is 0 or a pointer is missing");
  }
  SelectKernel<<<rows, kSelectThreads, 0, static_cast<cudaStream_t>(stream_ptr)>>>(scores, max_visible, visible, k,
                                                                                   selected, counts);
  return Launched("cuda::SelectTopTokens launch");
}

namespace {

// What GatherLatents and GatherLatentBlocks both check (`outputs`: their
// own pointers are there); block_bytes: the source blocks'.
Status CheckGather(const char* what, const MlaShape& shape, const PagedLatents& latents, uint32_t rows,
                   const int32_t* selected, const int32_t* counts, const unsigned long long* fault, bool outputs,
                   size_t* block_bytes) {
  *block_bytes = EncodedBytes(latents.codec, {latents.tokens_per_block, shape.kv_lora_rank, shape.rope_dim});
  if (*block_bytes == 0 || rows > 65535) {
    return InvalidArgument(std::string(what) + ": a block shape the codec refuses, or over 65535 rows");
  }
  if (!outputs || selected == nullptr || counts == nullptr || fault == nullptr ||
      latents.blocks_per_sequence == nullptr ||
      (latents.max_blocks_per_sequence > 0 && (latents.pool == nullptr || latents.block_table == nullptr)) ||
      (latents.max_tail > 0 && (latents.tail == nullptr || latents.tail_tokens == nullptr))) {
    return InvalidArgument(std::string(what) + ": a pointer is missing for the sizes given");
  }
  return Status();
}

}  // namespace

Status GatherLatents(const MlaShape& shape, const PagedLatents& latents, uint32_t rows, const int32_t* selected,
                     uint32_t k, const int32_t* counts, float* out, unsigned long long* fault, void* stream_ptr) {
  if (rows == 0 || k == 0) return Status();
  size_t block_bytes = 0;
  KVTIER_KERNELS_RETURN_IF_ERROR(
      CheckGather("cuda::GatherLatents", shape, latents, rows, selected, counts, fault, out != nullptr, &block_bytes));
  GatherKernel<<<dim3(k, rows), kGatherThreads, 0, static_cast<cudaStream_t>(stream_ptr)>>>(
      shape, latents, block_bytes, selected, k, counts, out, fault);
  return Launched("cuda::GatherLatents launch");
}

Status GatherLatentBlocks(const MlaShape& shape, const PagedLatents& latents, uint32_t rows, const int32_t* selected,
                          uint32_t k, const int32_t* counts, const GatheredLatents& out, unsigned long long* fault,
                          void* stream_ptr) {
  if (rows == 0 || k == 0) return Status();
  const bool outputs = (k < kGatheredBlockTokens || (out.pool != nullptr && out.block_table != nullptr)) &&
                       out.blocks != nullptr && out.tail != nullptr && out.tail_tokens != nullptr;
  size_t block_bytes = 0;
  KVTIER_KERNELS_RETURN_IF_ERROR(
      CheckGather("cuda::GatherLatentBlocks", shape, latents, rows, selected, counts, fault, outputs, &block_bytes));
  GatherBlocksKernel<<<dim3(k, rows), kGatherThreads, 0, static_cast<cudaStream_t>(stream_ptr)>>>(
      shape, latents, block_bytes, selected, k, counts, out, fault);
  return Launched("cuda::GatherLatentBlocks launch");
}

PagedLatents GatheredPagedLatents(const GatheredLatents& gathered, uint32_t rows, uint32_t k) {
  PagedLatents chosen;
  chosen.codec = Codec::kBf16;
  chosen.tokens_per_block = kGatheredBlockTokens;
  chosen.max_blocks_per_sequence = k / kGatheredBlockTokens;
  chosen.pool = chosen.max_blocks_per_sequence > 0 ? gathered.pool : nullptr;
  chosen.pool_blocks = rows * chosen.max_blocks_per_sequence;
  chosen.block_table = chosen.max_blocks_per_sequence > 0 ? gathered.block_table : nullptr;
  chosen.blocks_per_sequence = gathered.blocks;
  chosen.tail = gathered.tail;
  chosen.tail_tokens = gathered.tail_tokens;
  chosen.max_tail = kGatheredBlockTokens;
  return chosen;
}

}  // namespace kvtier::kernels::cuda
