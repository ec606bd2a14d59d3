// Paged MLA decode attention on tensor cores, for int8 blocks of 64 tokens
// of 512 + 64 (DeepSeek-V2/V3 with kvtier's int8 codec).
//
// One CUDA block (4 warps) per (split, group of 16 heads, sequence): the 16
// heads are the M dimension of mma.m16n8k16 (fp16 in, fp32 out). Per latent
// block: its codes (exact in fp16) and scales go to shared memory; the
// query is multiplied by the block's per-channel scales once (in fp16), so
// scores are Q'.codes; each warp scores 16 tokens over the 576 channels;
// an online softmax turns them into fp16 weights; each warp then sums
// weights x codes for its 128 of the 512 latent channels, and the block's
// scales are applied to that sum in fp32 (sum_t p*s*code = s * sum_t p*code).
// Tails (float tokens) are left to the CUDA-core kernel, as a split of
// their own. Not yet run on a GPU: check_mla_attention.cc tests it.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kvtier/kernels/float_formats.h"
#include "mla_attention_internal.h"

namespace kvtier::kernels::cuda::internal {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr uint32_t kHeads = 16;         // the mma's M
constexpr uint32_t kDim = 576, kKv = 512, kTokens = 64;
constexpr uint32_t kCodeStride = 584;   // bytes a token row takes in shared memory
constexpr uint32_t kQStride = 584;      // halves a head row of Q' takes
constexpr uint32_t kScoreStride = 68;   // floats a head row of scores takes
constexpr uint32_t kPStride = 72;       // halves a head row of weights takes
// The padded strides put the 8 rows a fragment load touches in different
// banks.

struct Shared {
  float q[kHeads][kDim];              // the group's queries (0 for padding heads)
  float scale[kDim];                  // this block's per-channel scales
  __half qs[kHeads][kQStride];        // q * scale, this block's
  int8_t codes[kTokens][kCodeStride];
  float scores[kHeads][kScoreStride];
  __half p[kHeads][kPStride];
  float run_max[kHeads], run_sum[kHeads], rescale[kHeads];
};

__device__ inline uint32_t Half2Bits(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t bits;
  memcpy(&bits, &h, 4);
  return bits;
}

__device__ inline uint32_t Load32(const void* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

// D = A * B + D; A 16x16 (row), B 16x8 (col), fp16 in, fp32 accumulate.
__device__ inline void Mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__global__ void __launch_bounds__(kThreads) TensorCoreKernel(Params p) {
  extern __shared__ __align__(16) unsigned char raw[];
  Shared& s = *reinterpret_cast<Shared*>(raw);
  const uint32_t split = p.split_base + blockIdx.x, b = blockIdx.z;
  const uint32_t h0 = blockIdx.y * kHeads, heads = min(kHeads, p.shape.heads - h0);
  const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t g = lane / 4, t4 = lane % 4;  // the fragments' row group and column pair
  const PagedLatents& L = p.latents;

  const int32_t nblocks = L.blocks_per_sequence[b];
  const int64_t table_row = TableRow(L, b);
  if (nblocks < 0 || static_cast<uint32_t>(nblocks) > L.max_blocks_per_sequence || table_row < 0) {
    if (threadIdx.x == 0) NoteBadInput(p.bad, b, kBadBlockCount);
    return;
  }
  for (uint32_t i = threadIdx.x; i < kHeads * kDim; i += kThreads) {
    const uint32_t h = i / kDim, c = i % kDim;
    s.q[h][c] = h < heads ? p.q[(size_t{b} * p.shape.heads + h0 + h) * kDim + c] : 0.0f;
  }
  if (threadIdx.x < kHeads) {
    s.run_max[threadIdx.x] = -INFINITY;
    s.run_sum[threadIdx.x] = 0.0f;
  }
  // This warp's 128 latent channels for all 16 heads: 16 n-tiles of 8.
  float acc[16][4] = {};

  const uint32_t first = (split - p.split_base) * p.blocks_per_split;
  const uint32_t last = min(first + p.blocks_per_split, static_cast<uint32_t>(nblocks));
  for (uint32_t j = first; j < last; ++j) {
    const int32_t index = L.block_table[static_cast<size_t>(table_row) * L.max_blocks_per_sequence + j];
    if (index < 0 || static_cast<uint32_t>(index) >= L.pool_blocks) {
      if (threadIdx.x == 0) NoteBadInput(p.bad, b, kBadBlockIndex);
      return;  // the whole CUDA block: index is the same for every thread
    }
    const uint8_t* block = L.pool + size_t(index) * p.block_bytes;
    __syncthreads();  // the previous block's codes and weights are no longer read
    for (uint32_t c = threadIdx.x; c < kDim; c += kThreads) {
      uint16_t bits;
      memcpy(&bits, block + 2 * c, 2);
      s.scale[c] = Bf16ToFloat(bits);
    }
    // Codes in 8-byte pieces (rows of 576 bytes, 8-aligned in the pool).
    const uint8_t* codes = block + 2 * kDim;
    for (uint32_t i = threadIdx.x; i < kTokens * (kDim / 8); i += kThreads) {
      const uint32_t t = i / (kDim / 8), piece = i % (kDim / 8);
      uint2 v;
      memcpy(&v, codes + size_t{t} * kDim + 8 * piece, 8);
      memcpy(&s.codes[t][8 * piece], &v, 8);
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < kHeads * kDim / 2; i += kThreads) {
      const uint32_t h = i / (kDim / 2), c = 2 * (i % (kDim / 2));
      const uint32_t bits = Half2Bits(s.q[h][c] * s.scale[c], s.q[h][c + 1] * s.scale[c + 1]);
      memcpy(&s.qs[h][c], &bits, 4);
    }
    __syncthreads();

    // Scores of this warp's 16 tokens (two n-tiles of 8).
    float score[2][4] = {};
    for (uint32_t k0 = 0; k0 < kDim; k0 += 16) {
      const uint32_t a[4] = {Load32(&s.qs[g][k0 + 2 * t4]), Load32(&s.qs[g + 8][k0 + 2 * t4]),
                             Load32(&s.qs[g][k0 + 8 + 2 * t4]), Load32(&s.qs[g + 8][k0 + 8 + 2 * t4])};
      for (uint32_t nt = 0; nt < 2; ++nt) {
        const int8_t* row = s.codes[warp * 16 + nt * 8 + g];
        const uint32_t bfrag[2] = {Half2Bits(row[k0 + 2 * t4], row[k0 + 2 * t4 + 1]),
                                   Half2Bits(row[k0 + 8 + 2 * t4], row[k0 + 8 + 2 * t4 + 1])};
        Mma(score[nt], a, bfrag);
      }
    }
    for (uint32_t nt = 0; nt < 2; ++nt) {
      const uint32_t t = warp * 16 + nt * 8 + 2 * t4;
      s.scores[g][t] = score[nt][0] * p.scale, s.scores[g][t + 1] = score[nt][1] * p.scale;
      s.scores[g + 8][t] = score[nt][2] * p.scale, s.scores[g + 8][t + 1] = score[nt][3] * p.scale;
    }
    __syncthreads();
    // Online softmax, one thread per head.
    if (threadIdx.x < kHeads) {
      const uint32_t h = threadIdx.x;
      float m = s.run_max[h];
      for (uint32_t t = 0; t < kTokens; ++t) m = fmaxf(m, s.scores[h][t]);
      const float r = __expf(s.run_max[h] - m);
      float sum = 0.0f;
      for (uint32_t t = 0; t < kTokens; ++t) {
        const float e = __expf(s.scores[h][t] - m);
        s.p[h][t] = __float2half_rn(e);
        sum += e;
      }
      s.run_sum[h] = s.run_sum[h] * r + sum;
      s.run_max[h] = m;
      s.rescale[h] = r;
    }
    __syncthreads();

    // Weighted sums of the codes for this warp's channels, then the scales.
    float part[16][4] = {};
    for (uint32_t k0 = 0; k0 < kTokens; k0 += 16) {
      const uint32_t a[4] = {Load32(&s.p[g][k0 + 2 * t4]), Load32(&s.p[g + 8][k0 + 2 * t4]),
                             Load32(&s.p[g][k0 + 8 + 2 * t4]), Load32(&s.p[g + 8][k0 + 8 + 2 * t4])};
      const uint32_t t = k0 + 2 * t4;
#pragma unroll
      for (uint32_t nt = 0; nt < 16; ++nt) {
        const uint32_t c = warp * 128 + nt * 8 + g;
        const uint32_t bfrag[2] = {Half2Bits(s.codes[t][c], s.codes[t + 1][c]),
                                   Half2Bits(s.codes[t + 8][c], s.codes[t + 9][c])};
        Mma(part[nt], a, bfrag);
      }
    }
    const float r_lo = s.rescale[g], r_hi = s.rescale[g + 8];
#pragma unroll
    for (uint32_t nt = 0; nt < 16; ++nt) {
      const uint32_t c = warp * 128 + nt * 8 + 2 * t4;
      acc[nt][0] = acc[nt][0] * r_lo + s.scale[c] * part[nt][0];
      acc[nt][1] = acc[nt][1] * r_lo + s.scale[c + 1] * part[nt][1];
      acc[nt][2] = acc[nt][2] * r_hi + s.scale[c] * part[nt][2];
      acc[nt][3] = acc[nt][3] * r_hi + s.scale[c + 1] * part[nt][3];
    }
  }
  __syncthreads();
  // A split with no blocks writes max -inf and sum 0: it weighs nothing.
  const size_t stride = size_t{kKv} + 2;
  float* out = p.partial + ((size_t{b} * p.splits + split) * p.shape.heads + h0) * stride;
  if (threadIdx.x < heads) {
    out[threadIdx.x * stride] = s.run_max[threadIdx.x];
    out[threadIdx.x * stride + 1] = s.run_sum[threadIdx.x];
  }
#pragma unroll
  for (uint32_t nt = 0; nt < 16; ++nt) {
    const uint32_t c = warp * 128 + nt * 8 + 2 * t4;
    if (g < heads) out[g * stride + 2 + c] = acc[nt][0], out[g * stride + 3 + c] = acc[nt][1];
    if (g + 8 < heads) out[(g + 8) * stride + 2 + c] = acc[nt][2], out[(g + 8) * stride + 3 + c] = acc[nt][3];
  }
}

}  // namespace

cudaError_t LaunchTensorCorePartials(const Params& p, uint32_t grid_splits, uint32_t batch, cudaStream_t stream) {
  const int smem = static_cast<int>(sizeof(Shared));
  if (const cudaError_t e = cudaFuncSetAttribute(TensorCoreKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      e != cudaSuccess) {
    return e;
  }
  const uint32_t groups = (p.shape.heads + kHeads - 1) / kHeads;
  TensorCoreKernel<<<dim3(grid_splits, groups, batch), kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvtier::kernels::cuda::internal
