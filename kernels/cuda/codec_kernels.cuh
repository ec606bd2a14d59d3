// The latent codecs' CUDA kernels, for codec.cu (which launches them, and
// is compiled without FMA contraction so that their bytes are the CPU
// codecs') and for tests/kernels/cuda_codec_emulation_test.cc, which runs
// them on the CPU under an emulation of CUDA's threads. Include it in one
// CUDA translation unit only, after <cuda_runtime.h> (or the emulation's
// stand-ins for it): its kernels are defined here.
#ifndef KVTIER_KERNELS_CUDA_CODEC_KERNELS_CUH_
#define KVTIER_KERNELS_CUDA_CODEC_KERNELS_CUH_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels::cuda::codec_kernels {

constexpr unsigned long long kNoBadValue = ~0ull;

__device__ inline void NoteBad(unsigned long long index, unsigned long long* first_bad) { atomicMin(first_bad, index); }

// x rounded to bf16; value `index` noted when that is not finite (NaN, inf,
// or beyond the bf16 range).
__device__ inline uint16_t Bf16Noting(float x, unsigned long long index, unsigned long long* first_bad) {
  const uint16_t h = FloatToBf16(x);
  if ((h & 0x7f80u) == 0x7f80u) NoteBad(index, first_bad);
  return h;
}

// One thread per value: round to bf16, note the first value that is not
// finite in bf16.
__global__ void QuantizeBf16Kernel(const float* in, uint16_t* out, size_t n, unsigned long long* first_bad) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  out[i] = Bf16Noting(in[i], i, first_bad);
}

__global__ void DequantizeBf16Kernel(const uint16_t* in, float* out, size_t n) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] = Bf16ToFloat(in[i]);
}

// An int8 channel's bf16 scale for its largest magnitude (rounded up, so
// that every code fits), and the reciprocal its codes are made with.
__device__ inline uint16_t Int8Scale(float amax, float* inv) {
  const uint16_t bits = FloatToBf16TowardPositive(fmaxf(__fdiv_rn(amax, 127.0f), kMinIntScale));
  *inv = __fdiv_rn(1.0f, Bf16ToFloat(bits));
  return bits;
}

// An int8 code's byte: the product rounded first, then to the nearest
// integer (ties to even), within +-127.
__device__ inline uint8_t Int8Code(float x, float inv) {
  return static_cast<uint8_t>(static_cast<int8_t>(fminf(fmaxf(rintf(__fmul_rn(x, inv)), -127.0f), 127.0f)));
}

// One CUDA block per latent block, one thread per channel (strided when the
// channels outnumber the threads): the channel's max over the tokens, its
// bf16 scale rounded up, then the codes. Adjacent threads read adjacent
// channels, so every load is coalesced.
__global__ void QuantizeInt8Kernel(const float* in, uint8_t* out, uint32_t tokens, uint32_t dim, size_t block_bytes,
                                   unsigned long long* first_bad) {
  const float* x = in + blockIdx.x * size_t{tokens} * dim;
  uint8_t* o = out + blockIdx.x * block_bytes;
  for (uint32_t c = threadIdx.x; c < dim; c += blockDim.x) {
    float amax = 0.0f;
    for (uint32_t t = 0; t < tokens; ++t) {
      const float v = x[size_t{t} * dim + c];
      if (!isfinite(v)) NoteBad((blockIdx.x * size_t{tokens} + t) * dim + c, first_bad);
      amax = fmaxf(amax, fabsf(v));
    }
    float inv;
    const uint16_t bits = Int8Scale(amax, &inv);
    std::memcpy(o + 2 * c, &bits, 2);
    int8_t* codes = reinterpret_cast<int8_t*>(o + 2 * size_t{dim});
    for (uint32_t t = 0; t < tokens; ++t) {
      codes[size_t{t} * dim + c] = static_cast<int8_t>(Int8Code(x[size_t{t} * dim + c], inv));
    }
  }
}

__global__ void DequantizeInt8Kernel(const uint8_t* in, float* out, uint32_t tokens, uint32_t dim, size_t block_bytes) {
  const uint8_t* b = in + blockIdx.x * block_bytes;
  float* y = out + blockIdx.x * size_t{tokens} * dim;
  const int8_t* codes = reinterpret_cast<const int8_t*>(b + 2 * size_t{dim});
  for (uint32_t c = threadIdx.x; c < dim; c += blockDim.x) {
    uint16_t bits;
    std::memcpy(&bits, b + 2 * c, 2);
    const float scale = Bf16ToFloat(bits);
    for (uint32_t t = 0; t < tokens; ++t) y[size_t{t} * dim + c] = __fmul_rn(codes[size_t{t} * dim + c], scale);
  }
}

// An int4 channel of values in [lo, hi]: its zero point (bf16 of the
// minimum, rounded down) and scale (bf16 of range / 15, rounded up) stored
// at channel c of the block `o` of `dim` channels, and the zero and
// reciprocal its codes are made with; false when they are not finite (a
// range too wide for a bf16 scale).
__device__ inline bool Int4Params(float lo, float hi, uint8_t* o, uint32_t dim, uint32_t c, float* zero, float* inv) {
  const uint16_t zero_bits = FloatToBf16TowardNegative(lo);
  *zero = Bf16ToFloat(zero_bits);
  const float range = __fsub_rn(hi, *zero);
  const uint16_t scale_bits = FloatToBf16TowardPositive(fmaxf(__fdiv_rn(range, 15.0f), kMinIntScale));
  const float scale = Bf16ToFloat(scale_bits);
  if (o != nullptr) {
    std::memcpy(o + 2 * c, &scale_bits, 2);
    std::memcpy(o + 2 * (size_t{dim} + c), &zero_bits, 2);
  }
  *inv = __fdiv_rn(1.0f, scale);
  return isfinite(*zero) && isfinite(range) && isfinite(scale);
}

// int4: one thread per packed byte column k, which owns channel k (low
// nibble) and channel k + half (high nibble): their zero points and scales,
// then every token's byte. No two threads write the same byte.
__device__ inline bool Int4Channel(const float* x, uint32_t tokens, uint32_t dim, uint32_t c, uint8_t* o, float* zero,
                                   float* inv, unsigned long long base, unsigned long long* first_bad) {
  float lo = x[c], hi = x[c];
  for (uint32_t t = 0; t < tokens; ++t) {
    const float v = x[size_t{t} * dim + c];
    if (!isfinite(v)) NoteBad(base + size_t{t} * dim + c, first_bad);
    lo = fminf(lo, v), hi = fmaxf(hi, v);
  }
  return Int4Params(lo, hi, o, dim, c, zero, inv);
}

__device__ inline uint8_t Int4Code(float x, float zero, float inv) {
  return static_cast<uint8_t>(fminf(fmaxf(rintf(__fmul_rn(__fsub_rn(x, zero), inv)), 0.0f), 15.0f));
}

__global__ void QuantizeInt4Kernel(const float* in, uint8_t* out, uint32_t tokens, uint32_t dim, size_t block_bytes,
                                   unsigned long long* first_bad) {
  const uint32_t half = (dim + 1) / 2;
  const float* x = in + blockIdx.x * size_t{tokens} * dim;
  uint8_t* o = out + blockIdx.x * block_bytes;
  const unsigned long long base = blockIdx.x * size_t{tokens} * dim;
  for (uint32_t k = threadIdx.x; k < half; k += blockDim.x) {
    float zero_lo, inv_lo, zero_hi = 0.0f, inv_hi = 0.0f;
    bool ok = Int4Channel(x, tokens, dim, k, o, &zero_lo, &inv_lo, base, first_bad);
    const bool has_high = half + k < dim;
    if (has_high) ok = Int4Channel(x, tokens, dim, half + k, o, &zero_hi, &inv_hi, base, first_bad) && ok;
    if (!ok) NoteBad(base + k, first_bad);  // a range too wide for a bf16 scale
    uint8_t* codes = o + 4 * size_t{dim};
    for (uint32_t t = 0; t < tokens; ++t) {
      const uint8_t low = Int4Code(x[size_t{t} * dim + k], zero_lo, inv_lo);
      const uint8_t high = has_high ? Int4Code(x[size_t{t} * dim + half + k], zero_hi, inv_hi) : 0;
      codes[size_t{t} * half + k] = static_cast<uint8_t>(low | high << 4);
    }
  }
}

__global__ void DequantizeInt4Kernel(const uint8_t* in, float* out, uint32_t tokens, uint32_t dim, size_t block_bytes) {
  const uint32_t half = (dim + 1) / 2;
  const uint8_t* b = in + blockIdx.x * block_bytes;
  float* y = out + blockIdx.x * size_t{tokens} * dim;
  for (uint32_t c = threadIdx.x; c < dim; c += blockDim.x) {
    uint16_t scale_bits, zero_bits;
    std::memcpy(&scale_bits, b + 2 * c, 2);
    std::memcpy(&zero_bits, b + 2 * (size_t{dim} + c), 2);
    const float scale = Bf16ToFloat(scale_bits), zero = Bf16ToFloat(zero_bits);
    const bool low = c < half;
    for (uint32_t t = 0; t < tokens; ++t) {
      const uint8_t byte = b[4 * size_t{dim} + size_t{t} * half + (low ? c : c - half)];
      const float code = low ? byte & 0xf : byte >> 4;
      y[size_t{t} * dim + c] = __fadd_rn(zero, __fmul_rn(code, scale));
    }
  }
}

// fp8 (FlashMLA's token layout): one thread per token and latent tile (the
// tile's bf16 amax, its power-of-two scale, 128 codes) and one per token for
// the bf16 rope part.
__global__ void QuantizeFp8Kernel(const float* in, uint8_t* out, size_t token_count, uint32_t latent, uint32_t rope,
                                  uint32_t tiles, size_t token_bytes, unsigned long long* first_bad) {
  const size_t item = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (item >= token_count * (tiles + 1)) return;
  const size_t token = item / (tiles + 1);
  const uint32_t part = static_cast<uint32_t>(item % (tiles + 1)), dim = latent + rope;
  const float* x = in + token * dim;
  uint8_t* o = out + token * token_bytes;
  if (part == tiles) {  // rope: bf16, as is
    for (uint32_t c = 0; c < rope; ++c) {
      const uint16_t h = Bf16Noting(x[latent + c], token * dim + latent + c, first_bad);
      std::memcpy(o + latent + 4 * size_t{tiles} + 2 * c, &h, 2);
    }
    return;
  }
  const uint32_t begin = part * kFp8TileSize, end = min(begin + kFp8TileSize, latent);
  float amax = 0.0f;
  for (uint32_t c = begin; c < end; ++c) {
    const float v = Bf16ToFloat(FloatToBf16(x[c]));
    if (!isfinite(v)) NoteBad(token * dim + c, first_bad);
    amax = fmaxf(amax, fabsf(v));
  }
  const float scale = Fp8TileScale(amax);
  const float inv = __fdiv_rn(1.0f, scale);  // exact: a power of two
  std::memcpy(o + latent + 4 * size_t{part}, &scale, 4);
  for (uint32_t c = begin; c < end; ++c) o[c] = Fp8E4m3FromInRange(__fmul_rn(Bf16ToFloat(FloatToBf16(x[c])), inv));
}

__global__ void DequantizeFp8Kernel(const uint8_t* in, float* out, size_t token_count, uint32_t latent, uint32_t rope,
                                    uint32_t tiles, size_t token_bytes) {
  const uint32_t dim = latent + rope;
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i >= token_count * dim) return;
  const size_t token = i / dim;
  const uint32_t c = static_cast<uint32_t>(i % dim);
  const uint8_t* b = in + token * token_bytes;
  if (c >= latent) {
    uint16_t h;
    std::memcpy(&h, b + latent + 4 * size_t{tiles} + 2 * size_t{c - latent}, 2);
    out[i] = Bf16ToFloat(h);
    return;
  }
  float scale;
  std::memcpy(&scale, b + latent + 4 * size_t{c / kFp8TileSize}, 4);
  out[i] = __fmul_rn(Fp8E4m3ToFloat(b[c]), scale);
}

// The kernels above take one value (or one channel's column) per thread;
// the ones below move 16 bytes per load or store, for shapes whose channel
// counts are multiples of 8 (fp8: latents of whole 128-channel tiles) and
// 16-byte aligned buffers, which is every model's. They compute each value
// with the same expressions, so the bytes are the same.

__device__ inline float Lane(const float4& v, uint32_t e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }

// bf16: 8 values a thread.
__global__ void QuantizeBf16x8Kernel(const float* in, uint16_t* out, size_t n8, unsigned long long* first_bad) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i >= n8) return;
  const float4 a = reinterpret_cast<const float4*>(in)[2 * i], b = reinterpret_cast<const float4*>(in)[2 * i + 1];
  const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint32_t packed[4];
  for (uint32_t k = 0; k < 8; k += 2) {
    const uint16_t lo = Bf16Noting(x[k], 8 * i + k, first_bad), hi = Bf16Noting(x[k + 1], 8 * i + k + 1, first_bad);
    packed[k / 2] = lo | uint32_t{hi} << 16;
  }
  reinterpret_cast<uint4*>(out)[i] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

__global__ void DequantizeBf16x8Kernel(const uint16_t* in, float* out, size_t n8) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i >= n8) return;
  const uint4 v = reinterpret_cast<const uint4*>(in)[i];
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  float x[8];
  for (uint32_t k = 0; k < 4; ++k) x[2 * k] = Bf16ToFloat(w[k] & 0xffffu), x[2 * k + 1] = Bf16ToFloat(w[k] >> 16);
  reinterpret_cast<float4*>(out)[2 * i] = make_float4(x[0], x[1], x[2], x[3]);
  reinterpret_cast<float4*>(out)[2 * i + 1] = make_float4(x[4], x[5], x[6], x[7]);
}

// int8 and int4: a CUDA block per latent block and chunk of quads of
// columns, kGroupTokens x (quads of the chunk) threads: thread (quad q,
// group j) holds its quad's columns of a group of tokens in registers, so
// each value is read once; the groups' extremes meet in shared memory. Each
// thread issues all its loads before it looks at any value (loads behind
// a loop's exit test went out one at a time), and small CUDA blocks keep
// several on a multiprocessor, one's loads overlapping another's
// arithmetic (the layouts tried: docs/notes/2026-12-05-h100-device-check.md).
constexpr uint32_t kGroupTokens = 8;
constexpr uint32_t kMaxGroups = 16;      // blocks of up to 128 tokens (longer: the one-column kernels)
constexpr uint32_t kChunkQuads = 48;     // int8: V2's 144 quads in 3 chunks
constexpr uint32_t kInt4ChunkQuads = 8;  // int4: byte quads (low and high nibbles), V2's 72 in 9 chunks
constexpr uint32_t kInt4MinBlocks = 4;   // int4: registers held for 4 CUDA blocks a multiprocessor

// The tokens of group j: at most kGroupTokens.
__device__ inline uint32_t GroupTokens(uint32_t tokens, uint32_t j) {
  return tokens > kGroupTokens * j ? min(kGroupTokens, tokens - kGroupTokens * j) : 0u;
}

__global__ void QuantizeInt8QuadsKernel(const float* in, uint8_t* out, uint32_t tokens, uint32_t dim,
                                        size_t block_bytes, unsigned long long* first_bad) {
  __shared__ float part[kMaxGroups][4 * kChunkQuads];  // [group][local channel]
  const uint32_t local = threadIdx.x % kChunkQuads, j = threadIdx.x / kChunkQuads, groups = blockDim.x / kChunkQuads;
  const uint32_t q = kChunkQuads * blockIdx.y + local;
  const bool active = q < dim / 4;
  const uint32_t n = active ? GroupTokens(tokens, j) : 0u;
  const float* x = in + blockIdx.x * size_t{tokens} * dim;
  uint8_t* o = out + blockIdx.x * block_bytes;
  float4 v[kGroupTokens];
#pragma unroll
  for (uint32_t i = 0; i < kGroupTokens; ++i) {
    if (i < n) v[i] = reinterpret_cast<const float4*>(x + size_t{kGroupTokens * j + i} * dim)[q];
  }
  float amax[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (uint32_t i = 0; i < kGroupTokens; ++i) {
    if (i >= n) break;
    for (uint32_t e = 0; e < 4; ++e) {
      const float value = Lane(v[i], e);
      if (!isfinite(value)) NoteBad((blockIdx.x * size_t{tokens} + kGroupTokens * j + i) * dim + 4 * q + e, first_bad);
      amax[e] = fmaxf(amax[e], fabsf(value));
    }
  }
  for (uint32_t e = 0; e < 4; ++e) part[j][4 * local + e] = amax[e];
  __syncthreads();
  if (!active) return;
  float inv[4];
  uint16_t bits[4];
  for (uint32_t e = 0; e < 4; ++e) {
    float a = 0.0f;
    for (uint32_t k = 0; k < groups; ++k) a = fmaxf(a, part[k][4 * local + e]);
    bits[e] = Int8Scale(a, &inv[e]);
  }
  if (j == 0) {
    reinterpret_cast<uint2*>(o)[q] = make_uint2(bits[0] | uint32_t{bits[1]} << 16, bits[2] | uint32_t{bits[3]} << 16);
  }
  uint8_t* codes = o + 2 * size_t{dim};
#pragma unroll
  for (uint32_t i = 0; i < kGroupTokens; ++i) {
    if (i >= n) break;
    uint32_t packed = 0;
    for (uint32_t e = 0; e < 4; ++e) packed |= uint32_t{Int8Code(Lane(v[i], e), inv[e])} << (8 * e);
    reinterpret_cast<uint32_t*>(codes + size_t{kGroupTokens * j + i} * dim)[q] = packed;
  }
}

// int4: the same over byte columns: thread (quad q, group j) holds byte
// columns 4q..4q+3, channels 4q.. (low nibbles) and half + 4q.. (high).
__global__ void __launch_bounds__(kInt4ChunkQuads* kMaxGroups, kInt4MinBlocks)
    QuantizeInt4QuadsKernel(const float* in, uint8_t* out, uint32_t tokens, uint32_t dim, size_t block_bytes,
                            unsigned long long* first_bad) {
  __shared__ float part[2 * kMaxGroups][8 * kInt4ChunkQuads];  // [2 group + (min, max)][8 local + k]
  const uint32_t half = dim / 2, local = threadIdx.x % kInt4ChunkQuads, j = threadIdx.x / kInt4ChunkQuads;
  const uint32_t groups = blockDim.x / kInt4ChunkQuads, q = kInt4ChunkQuads * blockIdx.y + local;
  const bool active = q < half / 4;
  const uint32_t n = active ? GroupTokens(tokens, j) : 0u;
  const float* x = in + blockIdx.x * size_t{tokens} * dim;
  uint8_t* o = out + blockIdx.x * block_bytes;
  const unsigned long long base = blockIdx.x * size_t{tokens} * dim;
  float4 v[kGroupTokens][2];  // [token][low, high]
#pragma unroll
  for (uint32_t i = 0; i < kGroupTokens; ++i) {
    for (uint32_t side = 0; side < 2; ++side) {
      if (i < n) v[i][side] = reinterpret_cast<const float4*>(x + size_t{kGroupTokens * j + i} * dim + side * half)[q];
    }
  }
  float lo[8], hi[8];  // channels 4q + e, then half + 4q + e
  for (uint32_t k = 0; k < 8; ++k) lo[k] = INFINITY, hi[k] = -INFINITY;
#pragma unroll
  for (uint32_t i = 0; i < kGroupTokens; ++i) {
    if (i >= n) break;
    for (uint32_t side = 0; side < 2; ++side) {
      for (uint32_t e = 0; e < 4; ++e) {
        const float value = Lane(v[i][side], e);
        if (!isfinite(value)) NoteBad(base + size_t{kGroupTokens * j + i} * dim + side * half + 4 * q + e, first_bad);
        lo[4 * side + e] = fminf(lo[4 * side + e], value), hi[4 * side + e] = fmaxf(hi[4 * side + e], value);
      }
    }
  }
  for (uint32_t k = 0; k < 8; ++k) part[2 * j][8 * local + k] = lo[k], part[2 * j + 1][8 * local + k] = hi[k];
  __syncthreads();
  if (!active) return;
  float zero[8], inv[8];
  bool ok[4] = {true, true, true, true};
  for (uint32_t k = 0; k < 8; ++k) {
    const uint32_t c = (k < 4 ? 0 : half) + 4 * q + k % 4;
    float l = part[0][8 * local + k], h = part[1][8 * local + k];
    for (uint32_t g = 1; g < groups; ++g)
      l = fminf(l, part[2 * g][8 * local + k]), h = fmaxf(h, part[2 * g + 1][8 * local + k]);
    // Group 0's threads store the parameters; every group makes codes.
    ok[k % 4] = Int4Params(l, h, j == 0 ? o : nullptr, dim, c, &zero[k], &inv[k]) && ok[k % 4];
  }
  if (j == 0) {
    for (uint32_t e = 0; e < 4; ++e) {
      if (!ok[e]) NoteBad(base + 4 * q + e, first_bad);  // a range too wide for a bf16 scale
    }
  }
  uint8_t* codes = o + 4 * size_t{dim};
#pragma unroll
  for (uint32_t i = 0; i < kGroupTokens; ++i) {
    if (i >= n) break;
    uint32_t packed = 0;
    for (uint32_t e = 0; e < 4; ++e) {
      const uint8_t low = Int4Code(Lane(v[i][0], e), zero[e], inv[e]);
      const uint8_t high = Int4Code(Lane(v[i][1], e), zero[4 + e], inv[4 + e]);
      packed |= uint32_t{static_cast<uint8_t>(low | high << 4)} << (8 * e);
    }
    reinterpret_cast<uint32_t*>(codes + size_t{kGroupTokens * j + i} * half)[q] = packed;
  }
}

// Dequantizing int8 and int4: a thread per token and 4 (byte) columns.
__global__ void DequantizeInt8QuadsKernel(const uint8_t* in, float* out, uint32_t tokens, uint32_t dim,
                                          size_t block_bytes, size_t items) {
  const size_t item = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (item >= items) return;
  const uint32_t quads = dim / 4, q = static_cast<uint32_t>(item % quads);
  const size_t row = item / quads, block = row / tokens;
  const uint32_t t = static_cast<uint32_t>(row % tokens);
  const uint8_t* b = in + block * block_bytes;
  const uint2 scale_bits = reinterpret_cast<const uint2*>(b)[q];
  const uint32_t codes = reinterpret_cast<const uint32_t*>(b + 2 * size_t{dim} + size_t{t} * dim)[q];
  const float scale[4] = {Bf16ToFloat(scale_bits.x & 0xffffu), Bf16ToFloat(scale_bits.x >> 16),
                          Bf16ToFloat(scale_bits.y & 0xffffu), Bf16ToFloat(scale_bits.y >> 16)};
  float y[4];
  for (uint32_t e = 0; e < 4; ++e) y[e] = __fmul_rn(static_cast<int8_t>(codes >> (8 * e)), scale[e]);
  reinterpret_cast<float4*>(out + row * dim)[q] = make_float4(y[0], y[1], y[2], y[3]);
}

__global__ void DequantizeInt4QuadsKernel(const uint8_t* in, float* out, uint32_t tokens, uint32_t dim,
                                          size_t block_bytes, size_t items) {
  const size_t item = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (item >= items) return;
  const uint32_t half = dim / 2, quads = half / 4, q = static_cast<uint32_t>(item % quads);
  const size_t row = item / quads, block = row / tokens;
  const uint32_t t = static_cast<uint32_t>(row % tokens);
  const uint8_t* b = in + block * block_bytes;
  const uint32_t codes = reinterpret_cast<const uint32_t*>(b + 4 * size_t{dim} + size_t{t} * half)[q];
  for (uint32_t side = 0; side < 2; ++side) {
    const uint2 scale_bits = reinterpret_cast<const uint2*>(b + 2 * side * half)[q];
    const uint2 zero_bits = reinterpret_cast<const uint2*>(b + 2 * (size_t{dim} + side * half))[q];
    const uint32_t s[2] = {scale_bits.x, scale_bits.y}, z[2] = {zero_bits.x, zero_bits.y};
    float y[4];
    for (uint32_t e = 0; e < 4; ++e) {
      const float scale = Bf16ToFloat((s[e / 2] >> (16 * (e % 2))) & 0xffffu);
      const float zero = Bf16ToFloat((z[e / 2] >> (16 * (e % 2))) & 0xffffu);
      const float code = static_cast<float>((codes >> (8 * e + 4 * side)) & 0xfu);
      y[e] = __fadd_rn(zero, __fmul_rn(code, scale));
    }
    reinterpret_cast<float4*>(out + row * dim + side * half)[q] = make_float4(y[0], y[1], y[2], y[3]);
  }
}

// fp8: a warp per token; lane l takes channels 4l..4l+3 of each 128-channel
// tile (the tile's amax by shuffles) and rope pairs 2l, 2l + 1 (+ 64 ...).
// A lane's loads of up to kLoadTiles tiles and its first rope pair go out
// before the first shuffle waits on them.
constexpr uint32_t kLoadTiles = 4;  // V2's and V3's 512 latent channels

__global__ void QuantizeFp8WarpKernel(const float* in, uint8_t* out, size_t token_count, uint32_t latent, uint32_t rope,
                                      size_t token_bytes, unsigned long long* first_bad) {
  const size_t token = (blockIdx.x * size_t{blockDim.x} + threadIdx.x) / 32;
  const uint32_t lane = threadIdx.x % 32, dim = latent + rope, tiles = latent / kFp8TileSize;
  if (token >= token_count) return;
  const float* x = in + token * dim;
  uint8_t* o = out + token * token_bytes;
  float2 rope_pair = make_float2(0.0f, 0.0f);
  if (2 * lane < rope) rope_pair = *reinterpret_cast<const float2*>(x + latent + 2 * lane);
  for (uint32_t first = 0; first < tiles; first += kLoadTiles) {
    const uint32_t count = min(kLoadTiles, tiles - first);
    float4 raw[kLoadTiles];
#pragma unroll
    for (uint32_t i = 0; i < kLoadTiles; ++i) {
      if (i < count) raw[i] = *reinterpret_cast<const float4*>(x + (first + i) * kFp8TileSize + 4 * lane);
    }
#pragma unroll
    for (uint32_t i = 0; i < kLoadTiles; ++i) {
      if (i >= count) break;
      const uint32_t tile = first + i, c = tile * kFp8TileSize + 4 * lane;
      float v[4], amax = 0.0f;
      for (uint32_t e = 0; e < 4; ++e) {
        v[e] = Bf16ToFloat(FloatToBf16(Lane(raw[i], e)));
        if (!isfinite(v[e])) NoteBad(token * dim + c + e, first_bad);
        amax = fmaxf(amax, fabsf(v[e]));
      }
      for (uint32_t d = 16; d > 0; d /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
      const float scale = Fp8TileScale(amax);
      const float inv = __fdiv_rn(1.0f, scale);  // exact: a power of two
      if (lane == 0) std::memcpy(o + latent + 4 * size_t{tile}, &scale, 4);
      uint32_t packed = 0;
      for (uint32_t e = 0; e < 4; ++e) packed |= uint32_t{Fp8E4m3FromInRange(__fmul_rn(v[e], inv))} << (8 * e);
      *reinterpret_cast<uint32_t*>(o + c) = packed;
    }
  }
  for (uint32_t c = 2 * lane; c < rope; c += 64) {
    const float2 raw = c == 2 * lane ? rope_pair : *reinterpret_cast<const float2*>(x + latent + c);
    const uint16_t lo = Bf16Noting(raw.x, token * dim + latent + c, first_bad);
    const uint16_t hi = Bf16Noting(raw.y, token * dim + latent + c + 1, first_bad);
    *reinterpret_cast<uint32_t*>(o + latent + 4 * size_t{tiles} + 2 * size_t{c}) = lo | uint32_t{hi} << 16;
  }
}

// A thread per token and 4 channels (latent e4m3 or rope bf16).
__global__ void DequantizeFp8QuadsKernel(const uint8_t* in, float* out, size_t items, uint32_t latent, uint32_t rope,
                                         size_t token_bytes) {
  const size_t item = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (item >= items) return;
  const uint32_t dim = latent + rope, quads = dim / 4, c = 4 * static_cast<uint32_t>(item % quads);
  const size_t token = item / quads;
  const uint8_t* b = in + token * token_bytes;
  float y[4];
  if (c >= latent) {
    // 4-byte aligned only (a token's bytes are, with an odd tile count).
    const uint32_t* bits =
        reinterpret_cast<const uint32_t*>(b + latent + 4 * size_t{latent / kFp8TileSize} + 2 * size_t{c - latent});
    y[0] = Bf16ToFloat(bits[0] & 0xffffu), y[1] = Bf16ToFloat(bits[0] >> 16);
    y[2] = Bf16ToFloat(bits[1] & 0xffffu), y[3] = Bf16ToFloat(bits[1] >> 16);
  } else {
    float scale;
    std::memcpy(&scale, b + latent + 4 * size_t{c / kFp8TileSize}, 4);
    const uint32_t codes = *reinterpret_cast<const uint32_t*>(b + c);
    for (uint32_t e = 0; e < 4; ++e) y[e] = __fmul_rn(Fp8E4m3ToFloat(static_cast<uint8_t>(codes >> (8 * e))), scale);
  }
  reinterpret_cast<float4*>(out + token * dim)[c / 4] = make_float4(y[0], y[1], y[2], y[3]);
}

// Where the 16-byte quantize kernels run: grid and CUDA block.
struct LaunchShape {
  dim3 grid, block;
};

// int8 and int4: `quads` columns of 4 values (int8) or bytes (int4) a
// token, in chunks of `chunk_quads`; false when a block's tokens are more
// than the groups their shared memory holds (the one-column kernels take
// those).
inline bool QuadsLaunch(BlockShape shape, size_t blocks, uint32_t quads, uint32_t chunk_quads, LaunchShape* out) {
  const uint32_t groups = (shape.tokens + kGroupTokens - 1) / kGroupTokens,
                 chunks = (quads + chunk_quads - 1) / chunk_quads;
  *out = {dim3(static_cast<uint32_t>(blocks), chunks), dim3(chunk_quads * groups)};
  return groups <= kMaxGroups;
}
inline bool Int8QuadsLaunch(BlockShape shape, size_t blocks, LaunchShape* out) {
  return QuadsLaunch(shape, blocks, shape.dim() / 4, kChunkQuads, out);
}
inline bool Int4QuadsLaunch(BlockShape shape, size_t blocks, LaunchShape* out) {
  return QuadsLaunch(shape, blocks, shape.dim() / 8, kInt4ChunkQuads, out);
}

// fp8: a warp a token, 8 tokens a CUDA block.
inline LaunchShape Fp8WarpLaunch(size_t tokens) { return {dim3(static_cast<uint32_t>((tokens + 7) / 8)), dim3(256)}; }

}  // namespace kvtier::kernels::cuda::codec_kernels

#endif  // KVTIER_KERNELS_CUDA_CODEC_KERNELS_CUH_
