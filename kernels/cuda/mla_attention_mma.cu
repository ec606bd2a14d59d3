// Paged MLA decode attention on tensor cores, for blocks of 64 tokens of
// 512 + 64 (DeepSeek-V2/V3) in every codec: a memory-bound kernel, so the
// latents are read from the pool once, straight into shared memory, and
// dequantized to fp16 once, next to the tensor cores that use them.
//
// One CUDA block (4 warps) per (split, group of 16 heads, sequence); the 16
// heads are the M dimension of mma.m16n8k16 (fp16 in, fp32 out). Each
// block's stored bytes arrive by cp.async, two blocks in flight. Warp w owns
// latent channels [128w, 128w + 128) and rope channels [512 + 16w, +16):
// its query fragments stay in registers, and per 16 tokens it dequantizes
// only its own channels into a private fp16 tile, which gives both the
// score products (ldmatrix) and, transposed, the weighted sums of its 128
// latent channels (ldmatrix.trans): keys and values are the same latents.
// The four warps' partial scores are summed through shared memory; each
// warp then runs the same online softmax in registers (the scores'
// accumulator layout is the weights' operand layout, as in FlashAttention
// 2). Tails (float tokens) are left to the CUDA-core kernel, as a split of
// their own.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "mla_attention_internal.h"

namespace kvtier::kernels::cuda::internal {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr uint32_t kHeads = 16;  // the mma's M
constexpr uint32_t kKv = 512, kRope = 64, kDim = kKv + kRope, kTokens = 64;
constexpr uint32_t kSub = 16;                         // tokens a warp dequantizes at a time
constexpr uint32_t kWarpKv = kKv / kWarps;            // 128
constexpr uint32_t kWarpRope = kRope / kWarps;        // 16
constexpr uint32_t kWarpChannels = kWarpKv + kWarpRope;  // 144: nine k-steps of 16
constexpr uint32_t kSteps = kWarpChannels / 16;
constexpr uint32_t kOctets = kWarpChannels / 8;       // 18 pieces of 8 channels per token
// Halves per tile row: 304 bytes put the 8 rows an ldmatrix reads in
// different banks.
constexpr uint32_t kTileStride = kWarpChannels + 8;
constexpr float kLog2e = 1.4426950408889634f;

// Shared memory after the two raw block buffers.
struct Shared {
  __half2 scale[kDim / 2];  // int8, int4: the block's per-channel scales in fp16
  __half2 min[kDim / 2];    // int4: the block's per-channel minimums
  __half tile[kWarps][kSub][kTileStride];
  float red[2][kWarps][kHeads][kSub];  // partial scores, double-buffered
};

__device__ inline uint32_t Bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ inline __half2 Half2(uint32_t bits) { return *reinterpret_cast<__half2*>(&bits); }
__device__ inline uint32_t PackHalves(float lo, float hi) { return Bits(__floats2half2_rn(lo, hi)); }

// Two bf16 (low half: the first) as fp16.
__device__ inline uint32_t Bf16PairToHalves(uint32_t w) {
  return PackHalves(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// Bytes 2i and 2i+1 of `w` (values 0..255) as fp16 1024 + byte: the exponent
// of 1024 above 8 mantissa bits.
__device__ inline __half2 MagicHalves(uint32_t w, uint32_t pair) {
  return Half2(__byte_perm(w, 0x64646464u, pair == 0 ? 0x4140 : 0x4342));
}

// Dequantizes channels [c, c + 8) of token t of a block into 8 fp16.
template <Codec kCodec>
__device__ inline uint4 Octet(const uint8_t* block, const Shared& s, uint32_t t, uint32_t c) {
  uint32_t h[4];
  if constexpr (kCodec == Codec::kBf16) {
    const uint4 v = *reinterpret_cast<const uint4*>(block + 2 * (t * kDim + c));
    h[0] = Bf16PairToHalves(v.x), h[1] = Bf16PairToHalves(v.y), h[2] = Bf16PairToHalves(v.z);
    h[3] = Bf16PairToHalves(v.w);
  } else if constexpr (kCodec == Codec::kInt8) {
    // Codes + 128 as 1024 + byte, minus 1152: the code exactly; then the scale.
    const uint2 v = *reinterpret_cast<const uint2*>(block + 2 * kDim + t * kDim + c);
    const __half2 bias = __float2half2_rn(1152.0f);
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t w = (i < 2 ? v.x : v.y) ^ 0x80808080u;
      h[i] = Bits(__hmul2(__hsub2(MagicHalves(w, i % 2), bias), s.scale[c / 2 + i]));
    }
  } else if constexpr (kCodec == Codec::kInt4) {
    // Byte j of a token holds channel j (low nibble) and j + 288 (high).
    constexpr uint32_t kHalf = kDim / 2;
    const uint2 v = *reinterpret_cast<const uint2*>(block + 4 * kDim + t * kHalf + (c < kHalf ? c : c - kHalf));
    const uint32_t shift = c < kHalf ? 0 : 4;
    const __half2 bias = __float2half2_rn(1024.0f);
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t w = ((i < 2 ? v.x : v.y) >> shift) & 0x0f0f0f0fu;
      h[i] = Bits(__hfma2(__hsub2(MagicHalves(w, i % 2), bias), s.scale[c / 2 + i], s.min[c / 2 + i]));
    }
  } else {  // kFp8: per token, 512 e4m3, 4 float scales (one per 128 channels), 64 bf16
    constexpr uint32_t kRow = kKv + 16 + 2 * kRope;
    const uint8_t* row = block + t * kRow;
    if (c >= kKv) {
      const uint4 v = *reinterpret_cast<const uint4*>(row + kKv + 16 + 2 * (c - kKv));
      h[0] = Bf16PairToHalves(v.x), h[1] = Bf16PairToHalves(v.y), h[2] = Bf16PairToHalves(v.z);
      h[3] = Bf16PairToHalves(v.w);
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(row + c);
      const float scale = *reinterpret_cast<const float*>(row + kKv + 4 * (c / kFp8TileSize));
      for (uint32_t i = 0; i < 4; ++i) {
        const uint32_t w = i < 2 ? v.x : v.y;
        const __half2_raw pair =
            __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(i % 2 == 0 ? w : w >> 16), __NV_E4M3);
        const float2 f = __half22float2(__half2(pair));
        h[i] = PackHalves(f.x * scale, f.y * scale);
      }
    }
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

// The latent channel a warp's local channel l stands for.
__device__ inline uint32_t Channel(uint32_t warp, uint32_t l) {
  return l < kWarpKv ? warp * kWarpKv + l : kKv + warp * kWarpRope + (l - kWarpKv);
}

// D = A * B + D; A 16x16 (row), B 16x8 (col), fp16 in, fp32 accumulate.
__device__ inline void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline void LoadMatrices(uint32_t (&r)[4], const void* row, bool transposed) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if (transposed) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
  }
}

__device__ inline void CopyAsync16(void* shared, const void* global) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global));
}
__device__ inline void CommitCopies() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ inline void WaitForAllButLatestCopies() { asm volatile("cp.async.wait_group 1;\n" ::); }

template <Codec kCodec>
__global__ void __launch_bounds__(kThreads) TensorCoreKernel(Params p, uint32_t raw_bytes) {
  extern __shared__ __align__(16) unsigned char smem[];
  Shared& s = *reinterpret_cast<Shared*>(smem + 2 * raw_bytes);
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
  const uint32_t first = (split - p.split_base) * p.blocks_per_split;
  const uint32_t blocks = static_cast<uint32_t>(nblocks);
  const uint32_t count = first < blocks ? min(first + p.blocks_per_split, blocks) - first : 0;
  const int32_t* table = L.block_table + static_cast<size_t>(table_row) * L.max_blocks_per_sequence + first;
  // Block k of this split into raw buffer k % 2 (the smem's start); a group is committed even when
  // empty, so that "all but the latest group" always means block k.
  auto fetch = [&](uint32_t k) {
    if (k < count) {
      const int32_t index = table[k];
      if (index < 0 || static_cast<uint32_t>(index) >= L.pool_blocks) {
        if (threadIdx.x == 0) NoteBadInput(p.bad, b, kBadBlockIndex);
      } else {
        const unsigned char* from = L.pool + size_t(index) * p.block_bytes;
        for (uint32_t i = threadIdx.x; i < p.block_bytes / 16; i += kThreads) {
          CopyAsync16(smem + (k % 2) * raw_bytes + 16 * i, from + 16 * i);
        }
      }
    }
    CommitCopies();
  };
  fetch(0);
  fetch(1);

  // The query's fragments for this warp's channels, in fp16 (padding heads 0).
  uint32_t qa[kSteps][4];
#pragma unroll
  for (uint32_t step = 0; step < kSteps; ++step) {
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t h = g + 8 * (i % 2), c = Channel(warp, 16 * step + 8 * (i / 2) + 2 * t4);
      const float* q = p.q + (size_t{b} * p.shape.heads + h0 + h) * kDim + c;
      qa[step][i] = h < heads ? PackHalves(q[0], q[1]) : 0u;
    }
  }
  float acc[kWarpKv / 8][4] = {};            // this warp's 128 channels of the weighted sums
  float run_max[2] = {-INFINITY, -INFINITY};  // rows g and g + 8, in log2 units
  float run_sum[2] = {0.0f, 0.0f};            // this thread's share of them
  const float score_scale = p.scale * kLog2e;
  uint32_t parity = 0;

  for (uint32_t k = 0; k < count; ++k) {
    WaitForAllButLatestCopies();
    __syncthreads();
    const uint8_t* block = smem + (k % 2) * raw_bytes;
    if constexpr (kCodec == Codec::kInt8 || kCodec == Codec::kInt4) {
      for (uint32_t i = threadIdx.x; i < kDim / 2; i += kThreads) {
        const uint32_t w = reinterpret_cast<const uint32_t*>(block)[i];
        s.scale[i] = Half2(Bf16PairToHalves(w));
        if constexpr (kCodec == Codec::kInt4) {
          s.min[i] = Half2(Bf16PairToHalves(reinterpret_cast<const uint32_t*>(block + 2 * kDim)[i]));
        }
      }
      __syncthreads();
    }
    for (uint32_t t0 = 0; t0 < kTokens; t0 += kSub) {
      // Dequantize this warp's channels of 16 tokens into its tile.
      __syncwarp();
#pragma unroll
      for (uint32_t j = 0; j < kSub * kOctets / 32; ++j) {
        const uint32_t i = lane + 32 * j, t = i / kOctets, l = 8 * (i % kOctets);
        *reinterpret_cast<uint4*>(&s.tile[warp][t][l]) = Octet<kCodec>(block, s, t0 + t, Channel(warp, l));
      }
      __syncwarp();
      // Partial scores over this warp's channels: 16 heads x 16 tokens.
      // All fragments first, then the products in two independent chains
      // per n-tile (the even and odd k-steps): their latencies overlap.
      uint32_t kf[kSteps][4];  // tokens 0-7 (k 0-7, 8-15), tokens 8-15 (k 0-7, 8-15)
#pragma unroll
      for (uint32_t step = 0; step < kSteps; ++step) {
        LoadMatrices(kf[step], &s.tile[warp][8 * (lane / 16) + lane % 8][16 * step + 8 * ((lane / 8) % 2)], false);
      }
      float score[2][4] = {}, odd[2][4] = {};
#pragma unroll
      for (uint32_t step = 0; step < kSteps; ++step) {
        float(&chain)[2][4] = step % 2 == 0 ? score : odd;
        Mma(chain[0], qa[step], kf[step][0], kf[step][1]);
        Mma(chain[1], qa[step], kf[step][2], kf[step][3]);
      }
#pragma unroll
      for (uint32_t nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (uint32_t e = 0; e < 4; ++e) score[nt][e] += odd[nt][e];
      }
      float(&red)[kHeads][kSub] = s.red[parity][warp];
#pragma unroll
      for (uint32_t nt = 0; nt < 2; ++nt) {
        const uint32_t t = 8 * nt + 2 * t4;
        *reinterpret_cast<float2*>(&red[g][t]) = make_float2(score[nt][0], score[nt][1]);
        *reinterpret_cast<float2*>(&red[g + 8][t]) = make_float2(score[nt][2], score[nt][3]);
      }
      __syncthreads();
#pragma unroll
      for (uint32_t nt = 0; nt < 2; ++nt) {
        const uint32_t t = 8 * nt + 2 * t4;
        float2 lo = make_float2(0.0f, 0.0f), hi = lo;
#pragma unroll
        for (uint32_t w = 0; w < kWarps; ++w) {
          const float2 a = *reinterpret_cast<const float2*>(&s.red[parity][w][g][t]);
          const float2 c = *reinterpret_cast<const float2*>(&s.red[parity][w][g + 8][t]);
          lo.x += a.x, lo.y += a.y, hi.x += c.x, hi.y += c.y;
        }
        score[nt][0] = lo.x * score_scale, score[nt][1] = lo.y * score_scale;
        score[nt][2] = hi.x * score_scale, score[nt][3] = hi.y * score_scale;
      }
      parity ^= 1;
      // Online softmax of rows g (elements 0, 1) and g + 8 (2, 3); a row's
      // 16 tokens are spread over the 4 threads of its quad.
      float rescale[2];
#pragma unroll
      for (uint32_t r = 0; r < 2; ++r) {
        float m = fmaxf(fmaxf(score[0][2 * r], score[0][2 * r + 1]), fmaxf(score[1][2 * r], score[1][2 * r + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        m = fmaxf(m, run_max[r]);
        rescale[r] = exp2f(run_max[r] - m);  // 0 on the first tokens
        run_max[r] = m;
        float sum = 0.0f;
#pragma unroll
        for (uint32_t nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (uint32_t e = 2 * r; e < 2 * r + 2; ++e) sum += (score[nt][e] = exp2f(score[nt][e] - m));
        }
        run_sum[r] = run_sum[r] * rescale[r] + sum;
      }
      // The weights as the A operand: k = token (the scores' columns).
      const uint32_t pa[4] = {PackHalves(score[0][0], score[0][1]), PackHalves(score[0][2], score[0][3]),
                              PackHalves(score[1][0], score[1][1]), PackHalves(score[1][2], score[1][3])};
#pragma unroll
      for (uint32_t nt = 0; nt < kWarpKv / 8; ++nt) {
        acc[nt][0] *= rescale[0], acc[nt][1] *= rescale[0];
        acc[nt][2] *= rescale[1], acc[nt][3] *= rescale[1];
      }
      uint32_t vf[kWarpKv / 16][4];  // channels 0-7 (tokens 0-7, 8-15), channels 8-15 (tokens 0-7, 8-15)
#pragma unroll
      for (uint32_t pair = 0; pair < kWarpKv / 16; ++pair) {
        LoadMatrices(vf[pair], &s.tile[warp][8 * ((lane / 8) % 2) + lane % 8][16 * pair + 8 * (lane / 16)], true);
      }
#pragma unroll
      for (uint32_t pair = 0; pair < kWarpKv / 16; ++pair) {
        Mma(acc[2 * pair], pa, vf[pair][0], vf[pair][1]);
        Mma(acc[2 * pair + 1], pa, vf[pair][2], vf[pair][3]);
      }
    }
    fetch(k + 2);  // every warp has passed its last read of this buffer (the barrier above)
  }
  // The quad's shares of each row's sum.
#pragma unroll
  for (uint32_t r = 0; r < 2; ++r) {
    run_sum[r] += __shfl_xor_sync(0xffffffffu, run_sum[r], 1);
    run_sum[r] += __shfl_xor_sync(0xffffffffu, run_sum[r], 2);
  }
  // A split with no blocks writes max -inf and sum 0: it weighs nothing.
  const size_t stride = size_t{kKv} + 2;
  float* out = p.partial + ((size_t{b} * p.splits + split) * p.shape.heads + h0) * stride;
  if (warp == 0 && t4 == 0) {
    for (uint32_t r = 0; r < 2; ++r) {
      const uint32_t h = g + 8 * r;
      if (h < heads) out[h * stride] = run_max[r] / kLog2e, out[h * stride + 1] = run_sum[r];
    }
  }
#pragma unroll
  for (uint32_t nt = 0; nt < kWarpKv / 8; ++nt) {
    const uint32_t c = warp * kWarpKv + 8 * nt + 2 * t4;
    if (g < heads) *reinterpret_cast<float2*>(&out[g * stride + 2 + c]) = make_float2(acc[nt][0], acc[nt][1]);
    if (g + 8 < heads) {
      *reinterpret_cast<float2*>(&out[(g + 8) * stride + 2 + c]) = make_float2(acc[nt][2], acc[nt][3]);
    }
  }
}

// Shared memory: two raw blocks, then Shared.
int SharedBytes(size_t block_bytes) { return static_cast<int>(2 * block_bytes + sizeof(Shared)); }

// The kernel for `codec`, its shared-memory limit raised to what it takes.
cudaError_t KernelFor(Codec codec, size_t block_bytes, void (**kernel)(Params, uint32_t)) {
  switch (codec) {
    case Codec::kBf16:
      *kernel = TensorCoreKernel<Codec::kBf16>;
      break;
    case Codec::kFp8:
      *kernel = TensorCoreKernel<Codec::kFp8>;
      break;
    case Codec::kInt8:
      *kernel = TensorCoreKernel<Codec::kInt8>;
      break;
    case Codec::kInt4:
      *kernel = TensorCoreKernel<Codec::kInt4>;
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaFuncSetAttribute(*kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SharedBytes(block_bytes));
}

}  // namespace

cudaError_t TensorCoreBlocksPerSm(Codec codec, size_t block_bytes, int* blocks) {
  void (*kernel)(Params, uint32_t) = nullptr;
  if (const cudaError_t e = KernelFor(codec, block_bytes, &kernel); e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kThreads, SharedBytes(block_bytes));
}

cudaError_t LaunchTensorCorePartials(const Params& p, uint32_t grid_splits, uint32_t batch, cudaStream_t stream) {
  void (*kernel)(Params, uint32_t) = nullptr;
  if (const cudaError_t e = KernelFor(p.latents.codec, p.block_bytes, &kernel); e != cudaSuccess) return e;
  const uint32_t groups = (p.shape.heads + kHeads - 1) / kHeads;
  kernel<<<dim3(grid_splits, groups, batch), kThreads, SharedBytes(p.block_bytes), stream>>>(
      p, static_cast<uint32_t>(p.block_bytes));
  return cudaGetLastError();
}

}  // namespace kvtier::kernels::cuda::internal
