// Paged MLA decode attention on tensor cores, for blocks of 64 tokens of
// 512 + 64 (DeepSeek-V2/V3) in every codec. The kernel is memory-bound; its
// first version was held back by shared memory's bandwidth (each latent
// byte went through it about 11 times), so a latent byte now passes
// through shared memory once: from the pool by cp.async (in stages of 16
// tokens, three in flight), then straight into registers, dequantized to
// fp16, as the operands of the tensor cores' products.
//
// One CUDA block (4 warps) per (split, group of 16 heads, sequence); the 16
// heads are the M dimension of mma.m16n8k16 (fp16 in, fp32 out). Warp w owns
// latent channels [128w, 128w + 128) and rope channels [512 + 16w, +16): its
// query fragments and its channels' scales stay in registers. Per stage, a
// thread dequantizes 16 consecutive channels of a token at a time
// into the key operand of the scores: the order of k inside an mma is free,
// so thread t4 of a row takes channels 16 t4 + 4j .. + 3 at k-step j, and
// the query's fragments follow the same order. The four warps' partial
// scores are summed through shared memory; each warp runs the same online
// softmax in registers (the scores' accumulator layout is the weights'
// operand layout, as in FlashAttention 2). movmatrix transposes the key
// operands into the value operands of the weighted sums (keys and values
// are the same latents), whose output channels come out in that same order.
// Tails (float tokens) are left to the CUDA-core kernel, as a split of
// their own.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "mla_attention_internal.h"

namespace kvtier::kernels::cuda::internal {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr uint32_t kHeads = 16;  // the mma's M
constexpr uint32_t kKv = 512, kRope = 64, kDim = kKv + kRope, kTokens = 64;
constexpr uint32_t kSub = 16;                            // tokens between score reductions
constexpr uint32_t kWarpKv = kKv / kWarps;               // 128: two groups of 64
constexpr uint32_t kWarpRope = kRope / kWarps;           // 16: one k-step
constexpr uint32_t kSteps = (kWarpKv + kWarpRope) / 16;  // 9
constexpr float kLog2e = 1.4426950408889634f;
// The pool is read in stages of 16 tokens (a block's per-channel constants
// come with its first), a ring of 4 in shared memory, 3 in flight: on an
// H200 the best for bf16 and fp8 of the layouts tried (two whole blocks in
// flight, 8 stages; docs/notes/2026-12-01-benchmark-history.md).
constexpr uint32_t kStages = 4;
constexpr uint32_t kStagesPerBlock = kTokens / kSub;

// A stored block's per-channel constants (int8: scales; int4: scales and
// minimums), before its tokens, and the bytes a token takes.
constexpr uint32_t PrefixBytes(Codec codec) {
  return codec == Codec::kInt8 ? 2 * kDim : codec == Codec::kInt4 ? 4 * kDim : 0;
}
constexpr uint32_t RowBytes(Codec codec) {
  return codec == Codec::kBf16   ? 2 * kDim
         : codec == Codec::kInt8 ? kDim
         : codec == Codec::kInt4 ? kDim / 2
                                 : kKv + 16 + 2 * kRope;
}
// A stage: the prefix, then 16 tokens' rows, so that a stage reads as a
// block of 16 tokens.
constexpr uint32_t StageBytes(Codec codec) { return PrefixBytes(codec) + kSub * RowBytes(codec); }

struct Shared {
  // Partial scores, double-buffered: each thread's 4 of each n-tile (its
  // accumulators), at its lane; the warps' threads of a lane hold the same
  // positions.
  float4 red[2][kWarps][2][32];
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

// The first of the 16 (kv) or 4 (rope) consecutive channels thread t4 of
// warp w dequantizes at k-step `step`, and the first of its channels in the
// (k = 2 t4, 2 t4 + 1) and (k = 8 + 2 t4, 9 + 2 t4) pairs of that step.
__device__ inline uint32_t RunStart(uint32_t warp, uint32_t t4, uint32_t group) {
  return group < 2 ? warp * kWarpKv + 64 * group + 16 * t4 : kKv + warp * kWarpRope + 4 * t4;
}
__device__ inline uint32_t StepChannel(uint32_t warp, uint32_t t4, uint32_t step) {
  return step < 8 ? RunStart(warp, t4, step / 4) + 4 * (step % 4) : RunStart(warp, t4, 2);
}

// A thread's per-channel constants for one block (int8: scales; int4:
// scales and minimums), fp16 pairs: 8 per kv group, 2 for the rope run.
struct ChannelConstants {
  uint32_t scale[18], min[18];
};

template <Codec kCodec>
__device__ inline void LoadConstants(const uint8_t* block, uint32_t warp, uint32_t t4, ChannelConstants& k) {
  if constexpr (kCodec == Codec::kInt8 || kCodec == Codec::kInt4) {
#pragma unroll
    for (uint32_t group = 0; group < 3; ++group) {
      const uint32_t c = RunStart(warp, t4, group), pairs = group < 2 ? 8 : 2;
#pragma unroll
      for (uint32_t i = 0; i < pairs; ++i) {
        k.scale[8 * group + i] = Bf16PairToHalves(*reinterpret_cast<const uint32_t*>(block + 2 * (c + 2 * i)));
        if constexpr (kCodec == Codec::kInt4) {
          k.min[8 * group + i] = Bf16PairToHalves(*reinterpret_cast<const uint32_t*>(block + 2 * (kDim + c + 2 * i)));
        }
      }
    }
  }
}

// 4 codes held in the bytes of `w` (int8: two's complement; int4: 0..15),
// dequantized into two fp16 pairs.
template <Codec kCodec>
__device__ inline void DequantizeWord(uint32_t w, const uint32_t* scale, const uint32_t* min, uint32_t* out) {
#pragma unroll
  for (uint32_t i = 0; i < 2; ++i) {
    if constexpr (kCodec == Codec::kInt8) {
      // code + 128 as 1024 + byte, minus 1152: the code exactly.
      const __half2 code = __hsub2(MagicHalves(w ^ 0x80808080u, i), __float2half2_rn(1152.0f));
      out[i] = Bits(__hmul2(code, Half2(scale[i])));
    } else {
      const __half2 code = __hsub2(MagicHalves(w, i), __float2half2_rn(1024.0f));
      out[i] = Bits(__hfma2(code, Half2(scale[i]), Half2(min[i])));
    }
  }
}

// Channels [c, c + kCount) of token t (kCount 16 or 4), dequantized into
// kCount / 2 fp16 pairs; `first` indexes the thread's constants for them.
template <Codec kCodec, uint32_t kCount>
__device__ inline void Dequantize(const uint8_t* block, uint32_t t, uint32_t c, const ChannelConstants& k,
                                  uint32_t first, uint32_t (&out)[kCount / 2]) {
  constexpr uint32_t kWords = kCount / 4;  // 8-bit codes
  if constexpr (kCodec == Codec::kBf16 || (kCodec == Codec::kFp8 && kCount == 4)) {
    // bf16 (fp8's rope too): two values a word.
    const uint8_t* from = kCodec == Codec::kBf16 ? block + 2 * (t * kDim + c)
                                                 : block + t * (kKv + 16 + 2 * kRope) + kKv + 16 + 2 * (c - kKv);
    if constexpr (kCount == 16) {
      const uint4 a = reinterpret_cast<const uint4*>(from)[0], z = reinterpret_cast<const uint4*>(from)[1];
      const uint32_t w[8] = {a.x, a.y, a.z, a.w, z.x, z.y, z.z, z.w};
#pragma unroll
      for (uint32_t i = 0; i < 8; ++i) out[i] = Bf16PairToHalves(w[i]);
    } else {
      const uint2 a = *reinterpret_cast<const uint2*>(from);
      out[0] = Bf16PairToHalves(a.x), out[1] = Bf16PairToHalves(a.y);
    }
  } else {
    const uint8_t* from;
    uint32_t shift = 0;
    if constexpr (kCodec == Codec::kInt8) {
      from = block + 2 * kDim + t * kDim + c;
    } else if constexpr (kCodec == Codec::kInt4) {  // byte j: channel j (low nibble), j + 288 (high)
      constexpr uint32_t kHalf = kDim / 2;
      from = block + 4 * kDim + t * kHalf + (c < kHalf ? c : c - kHalf);
      shift = c < kHalf ? 0 : 4;
    } else {  // fp8 latents: per token 512 e4m3, then 4 float scales
      from = block + t * (kKv + 16 + 2 * kRope) + c;
    }
    uint32_t w[kWords];
    if constexpr (kCount == 16) {
      const uint4 a = *reinterpret_cast<const uint4*>(from);
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    } else {
      w[0] = *reinterpret_cast<const uint32_t*>(from);
    }
    if constexpr (kCodec == Codec::kFp8) {
      const float scale = *reinterpret_cast<const float*>(from - c + kKv + 4 * (c / kFp8TileSize));
#pragma unroll
      for (uint32_t i = 0; i < kCount / 2; ++i) {
        const __half2_raw pair =
            __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
        const float2 f = __half22float2(__half2(pair));
        out[i] = PackHalves(f.x * scale, f.y * scale);
      }
    } else {
#pragma unroll
      for (uint32_t i = 0; i < kWords; ++i) {
        const uint32_t codes = kCodec == Codec::kInt4 ? (w[i] >> shift) & 0x0f0f0f0fu : w[i];
        DequantizeWord<kCodec>(codes, k.scale + first + 2 * i, k.min + first + 2 * i, out + 2 * i);
      }
    }
  }
}

// 2^x by the hardware's approximation (2 ulp; exp2f adds range handling
// the scores do not need: they are finite and at most 0 after the max).
__device__ inline float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// D = A * B + D; A 16x16 (row), B 16x8 (col), fp16 in, fp32 accumulate.
__device__ inline void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The 8x8 fp16 matrix a warp holds (thread: row g, columns 2 t4, 2 t4 + 1),
// transposed.
__device__ inline uint32_t Transpose(uint32_t m) {
  uint32_t t;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(t) : "r"(m));
  return t;
}

__device__ inline void CopyAsync16(void* shared, const void* global) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global));
}
__device__ inline void CommitCopies() { asm volatile("cp.async.commit_group;\n" ::); }
// All but the latest kStages - 2 groups: the stage about to be read.
__device__ inline void WaitForStage() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2)); }

// At most 168 registers a thread, for three CUDA blocks a multiprocessor:
// bf16 and fp8 need no more; int8 spills a little and gains more from the
// third block than it loses; int4 would spill more, and keeps two.
template <Codec kCodec>
__global__ void __launch_bounds__(kThreads, kCodec == Codec::kInt4 ? 2 : 3) TensorCoreKernel(Params p) {
  constexpr uint32_t kPrefix = PrefixBytes(kCodec), kRow = RowBytes(kCodec), kStage = StageBytes(kCodec);
  extern __shared__ __align__(16) unsigned char smem[];
  Shared& s = *reinterpret_cast<Shared*>(smem + kStages * kStage);
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
  // Stage i (tokens 16 (i % 4).. of the split's block i / 4) into buffer
  // i % kStages; a group is committed even when empty, so that the wait
  // always means stage i.
  const uint32_t stages = kStagesPerBlock * count;
  auto fetch = [&](uint32_t i) {
    if (i < stages) {
      const int32_t index = table[i / kStagesPerBlock];
      if (index < 0 || static_cast<uint32_t>(index) >= L.pool_blocks) {
        if (threadIdx.x == 0) NoteBadInput(p.bad, b, kBadBlockIndex);
      } else {
        const unsigned char* from = L.pool + size_t(index) * p.block_bytes;
        unsigned char* to = smem + (i % kStages) * kStage;
        const uint32_t quarter = i % kStagesPerBlock;
        if constexpr (kPrefix > 0) {
          if (quarter == 0) {
            for (uint32_t j = threadIdx.x; j < kPrefix / 16; j += kThreads) CopyAsync16(to + 16 * j, from + 16 * j);
          }
        }
        from += kPrefix + quarter * kSub * kRow;
        for (uint32_t j = threadIdx.x; j < kSub * kRow / 16; j += kThreads) {
          CopyAsync16(to + kPrefix + 16 * j, from + 16 * j);
        }
      }
    }
    CommitCopies();
  };
  for (uint32_t i = 0; i + 1 < kStages; ++i) fetch(i);

  // The query's fragments, in the keys' k order, fp16 (padding heads 0).
  uint32_t qa[kSteps][4];
#pragma unroll
  for (uint32_t step = 0; step < kSteps; ++step) {
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t h = g + 8 * (i % 2), c = StepChannel(warp, t4, step) + 2 * (i / 2);
      const float* q = p.q + (size_t{b} * p.shape.heads + h0 + h) * kDim + c;
      qa[step][i] = h < heads ? PackHalves(q[0], q[1]) : 0u;
    }
  }
  // Weighted sums of this warp's 128 channels: n-tile 8 G + 2 j + r holds
  // channels RunStart(G) + 16 t + 4 j + 2 r + {0, 1}, t = 0..3.
  float acc[kWarpKv / 8][4] = {};
  float run_max[2] = {-INFINITY, -INFINITY};  // rows g and g + 8, in log2 units
  float run_sum[2] = {0.0f, 0.0f};            // this thread's share of them
  const float score_scale = p.scale * kLog2e;
  uint32_t parity = 0;

  ChannelConstants constants;
  for (uint32_t i = 0; i < stages; ++i) {
    WaitForStage();
    __syncthreads();
    // Every warp has passed its last read of stage i - 1 (before the
    // barrier above): its buffer takes stage i + kStages - 1.
    fetch(i + kStages - 1);
    const uint8_t* block = smem + (i % kStages) * kStage;
    if (i % kStagesPerBlock == 0) LoadConstants<kCodec>(block, warp, t4, constants);
    {
      // The keys: kf[step][nt] = (k = 2 t4.., k = 8 + 2 t4..) of the stage's token 8 nt + g.
      uint32_t kf[kSteps][2][2];
#pragma unroll
      for (uint32_t nt = 0; nt < 2; ++nt) {
        const uint32_t t = 8 * nt + g;
#pragma unroll
        for (uint32_t group = 0; group < 2; ++group) {
          uint32_t v[8];
          Dequantize<kCodec, 16>(block, t, RunStart(warp, t4, group), constants, 8 * group, v);
#pragma unroll
          for (uint32_t j = 0; j < 4; ++j) kf[4 * group + j][nt][0] = v[2 * j], kf[4 * group + j][nt][1] = v[2 * j + 1];
        }
        uint32_t v[2];
        Dequantize<kCodec, 4>(block, t, RunStart(warp, t4, 2), constants, 16, v);
        kf[8][nt][0] = v[0], kf[8][nt][1] = v[1];
      }
      // Partial scores over this warp's channels, in two independent chains
      // per n-tile (even and odd k-steps) whose latencies overlap.
      float score[2][4] = {}, odd[2][4] = {};
#pragma unroll
      for (uint32_t step = 0; step < kSteps; ++step) {
        float(&chain)[2][4] = step % 2 == 0 ? score : odd;
        Mma(chain[0], qa[step], kf[step][0][0], kf[step][0][1]);
        Mma(chain[1], qa[step], kf[step][1][0], kf[step][1][1]);
      }
      s.red[parity][warp][0][lane] = make_float4(score[0][0] + odd[0][0], score[0][1] + odd[0][1],
                                                 score[0][2] + odd[0][2], score[0][3] + odd[0][3]);
      s.red[parity][warp][1][lane] = make_float4(score[1][0] + odd[1][0], score[1][1] + odd[1][1],
                                                 score[1][2] + odd[1][2], score[1][3] + odd[1][3]);
      __syncthreads();
#pragma unroll
      for (uint32_t nt = 0; nt < 2; ++nt) {
        float4 sum = s.red[parity][0][nt][lane];
#pragma unroll
        for (uint32_t w = 1; w < kWarps; ++w) {
          const float4 part = s.red[parity][w][nt][lane];
          sum.x += part.x, sum.y += part.y, sum.z += part.z, sum.w += part.w;
        }
        score[nt][0] = sum.x * score_scale, score[nt][1] = sum.y * score_scale;
        score[nt][2] = sum.z * score_scale, score[nt][3] = sum.w * score_scale;
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
        rescale[r] = Exp2(run_max[r] - m);  // 0 on the first tokens
        run_max[r] = m;
        float sum = 0.0f;
#pragma unroll
        for (uint32_t nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (uint32_t e = 2 * r; e < 2 * r + 2; ++e) sum += (score[nt][e] = Exp2(score[nt][e] - m));
        }
        run_sum[r] = run_sum[r] * rescale[r] + sum;
      }
      // The weights as the A operand: k = token (the scores' columns).
      const uint32_t pa[4] = {PackHalves(score[0][0], score[0][1]), PackHalves(score[0][2], score[0][3]),
                              PackHalves(score[1][0], score[1][1]), PackHalves(score[1][2], score[1][3])};
      // Past the first tokens the running max seldom moves: skip the
      // rescale when it moved in no row of the warp.
      if (__any_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
#pragma unroll
        for (uint32_t nt = 0; nt < kWarpKv / 8; ++nt) {
          acc[nt][0] *= rescale[0], acc[nt][1] *= rescale[0];
          acc[nt][2] *= rescale[1], acc[nt][3] *= rescale[1];
        }
      }
      // The values: each key operand (8 tokens x 8 channels) transposed.
#pragma unroll
      for (uint32_t step = 0; step < 8; ++step) {
#pragma unroll
        for (uint32_t r = 0; r < 2; ++r) {
          Mma(acc[2 * step + r], pa, Transpose(kf[step][0][r]), Transpose(kf[step][1][r]));
        }
      }
    }
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
    const uint32_t c = RunStart(warp, t4, nt / 8) + 4 * ((nt % 8) / 2) + 2 * (nt % 2);
    if (g < heads) *reinterpret_cast<float2*>(&out[g * stride + 2 + c]) = make_float2(acc[nt][0], acc[nt][1]);
    if (g + 8 < heads) {
      *reinterpret_cast<float2*>(&out[(g + 8) * stride + 2 + c]) = make_float2(acc[nt][2], acc[nt][3]);
    }
  }
}

// Shared memory: the ring of stages, then Shared.
int SharedBytes(Codec codec) { return static_cast<int>(kStages * StageBytes(codec) + sizeof(Shared)); }

// The kernel for `codec`, its shared-memory limit raised to what it takes,
// and how many of its CUDA blocks fit a multiprocessor: found once per
// device and codec (each decode call, a layer's, would otherwise set the
// attribute and ask the occupancy again).
struct Prepared {
  void (*kernel)(Params) = nullptr;
  int blocks_per_sm = 0;
};

cudaError_t Prepare(Codec codec, Prepared* out) {
  void (*kernel)(Params) = nullptr;
  switch (codec) {
    case Codec::kBf16:
      kernel = TensorCoreKernel<Codec::kBf16>;
      break;
    case Codec::kFp8:
      kernel = TensorCoreKernel<Codec::kFp8>;
      break;
    case Codec::kInt8:
      kernel = TensorCoreKernel<Codec::kInt8>;
      break;
    case Codec::kInt4:
      kernel = TensorCoreKernel<Codec::kInt4>;
      break;
    default:
      return cudaErrorInvalidValue;
  }
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mu;
  static std::map<std::pair<int, Codec>, Prepared> prepared;
  std::lock_guard<std::mutex> lock(mu);
  auto it = prepared.find({device, codec});
  if (it == prepared.end()) {
    Prepared p{kernel, 0};
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SharedBytes(codec));
    if (e == cudaSuccess) {
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&p.blocks_per_sm, kernel, kThreads, SharedBytes(codec));
    }
    if (e != cudaSuccess) return e;
    it = prepared.emplace(std::make_pair(device, codec), p).first;
  }
  *out = it->second;
  return cudaSuccess;
}

}  // namespace

cudaError_t TensorCoreBlocksPerSm(Codec codec, int* blocks) {
  Prepared p;
  if (const cudaError_t e = Prepare(codec, &p); e != cudaSuccess) return e;
  *blocks = p.blocks_per_sm;
  return cudaSuccess;
}

cudaError_t LaunchTensorCorePartials(const Params& p, uint32_t grid_splits, uint32_t batch, cudaStream_t stream) {
  Prepared prepared;
  if (const cudaError_t e = Prepare(p.latents.codec, &prepared); e != cudaSuccess) return e;
  const uint32_t groups = (p.shape.heads + kHeads - 1) / kHeads;
  prepared.kernel<<<dim3(grid_splits, groups, batch), kThreads, SharedBytes(p.latents.codec), stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvtier::kernels::cuda::internal
