// The latent codecs as CUDA kernels. Every rounding goes through the
// same functions as the CPU codecs (float_formats.h) or an explicitly
// rounded CUDA intrinsic, and nvcc's FMA contraction is off for this file
// (as -ffp-contract=off is for the CPU codecs), so the bytes are the CPU's.
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "kvtier/kernels/cuda_codec.h"
#include "kvtier/kernels/float_formats.h"
#include "cuda_status.h"
#include "stream_memory.h"

namespace kvtier::kernels::cuda {
namespace {

constexpr unsigned long long kNoBadValue = ~0ull;

__device__ void NoteBad(unsigned long long index, unsigned long long* first_bad) { atomicMin(first_bad, index); }

// One thread per value: round to bf16, note the first value that is not
// finite in bf16 (NaN, inf, or beyond the bf16 range).
__global__ void QuantizeBf16Kernel(const float* in, uint16_t* out, size_t n, unsigned long long* first_bad) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const uint16_t h = FloatToBf16(in[i]);
  if ((h & 0x7f80u) == 0x7f80u) NoteBad(i, first_bad);
  out[i] = h;
}

__global__ void DequantizeBf16Kernel(const uint16_t* in, float* out, size_t n) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] = Bf16ToFloat(in[i]);
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
    const uint16_t bits = FloatToBf16TowardPositive(fmaxf(__fdiv_rn(amax, 127.0f), kMinIntScale));
    std::memcpy(o + 2 * c, &bits, 2);
    const float inv = __fdiv_rn(1.0f, Bf16ToFloat(bits));
    int8_t* codes = reinterpret_cast<int8_t*>(o + 2 * size_t{dim});
    for (uint32_t t = 0; t < tokens; ++t) {
      // The product rounded first, then to the nearest integer, ties to even.
      const float q = fminf(fmaxf(rintf(__fmul_rn(x[size_t{t} * dim + c], inv)), -127.0f), 127.0f);
      codes[size_t{t} * dim + c] = static_cast<int8_t>(q);
    }
  }
}

__global__ void DequantizeInt8Kernel(const uint8_t* in, float* out, uint32_t tokens, uint32_t dim,
                                     size_t block_bytes) {
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

// int4: one thread per packed byte column k, which owns channel k (low
// nibble) and channel k + half (high nibble): their zero points (bf16 of the
// minimum, rounded down) and scales (bf16 of range / 15, rounded up), then
// every token's byte. No two threads write the same byte.
__device__ bool Int4Channel(const float* x, uint32_t tokens, uint32_t dim, uint32_t c, uint8_t* o, float* zero,
                            float* inv, unsigned long long base, unsigned long long* first_bad) {
  float lo = x[c], hi = x[c];
  for (uint32_t t = 0; t < tokens; ++t) {
    const float v = x[size_t{t} * dim + c];
    if (!isfinite(v)) NoteBad(base + size_t{t} * dim + c, first_bad);
    lo = fminf(lo, v), hi = fmaxf(hi, v);
  }
  const uint16_t zero_bits = FloatToBf16TowardNegative(lo);
  *zero = Bf16ToFloat(zero_bits);
  const float range = __fsub_rn(hi, *zero);
  const uint16_t scale_bits = FloatToBf16TowardPositive(fmaxf(__fdiv_rn(range, 15.0f), kMinIntScale));
  const float scale = Bf16ToFloat(scale_bits);
  std::memcpy(o + 2 * c, &scale_bits, 2);
  std::memcpy(o + 2 * (size_t{dim} + c), &zero_bits, 2);
  *inv = __fdiv_rn(1.0f, scale);
  return isfinite(*zero) && isfinite(range) && isfinite(scale);
}

__device__ uint8_t Int4Code(float x, float zero, float inv) {
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

__global__ void DequantizeInt4Kernel(const uint8_t* in, float* out, uint32_t tokens, uint32_t dim,
                                     size_t block_bytes) {
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
__global__ void QuantizeFp8Kernel(const float* in, uint8_t* out, size_t token_count, uint32_t latent,
                                  uint32_t rope, uint32_t tiles, size_t token_bytes, unsigned long long* first_bad) {
  const size_t item = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (item >= token_count * (tiles + 1)) return;
  const size_t token = item / (tiles + 1);
  const uint32_t part = static_cast<uint32_t>(item % (tiles + 1)), dim = latent + rope;
  const float* x = in + token * dim;
  uint8_t* o = out + token * token_bytes;
  if (part == tiles) {  // rope: bf16, as is
    for (uint32_t c = 0; c < rope; ++c) {
      const uint16_t h = FloatToBf16(x[latent + c]);
      if ((h & 0x7f80u) == 0x7f80u) NoteBad(token * dim + latent + c, first_bad);
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

Status Finish(cudaStream_t stream, unsigned long long* first_bad, BlockShape shape, const char* what) {
  unsigned long long bad = kNoBadValue;
  if (first_bad != nullptr) {
    if (cudaError_t e = cudaMemcpyAsync(&bad, first_bad, sizeof bad, cudaMemcpyDeviceToHost, stream); e != cudaSuccess) {
      cudaFreeAsync(first_bad, stream);
      return CudaError(e, what);
    }
  }
  if (first_bad != nullptr) cudaFreeAsync(first_bad, stream);
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) return CudaError(e, what);
  if (bad != kNoBadValue) {
    const unsigned long long per_block = shape.values();
    return InvalidArgument("value at block " + std::to_string(bad / per_block) + ", token " +
                           std::to_string(bad % per_block / shape.dim()) + ", channel " +
                           std::to_string(bad % shape.dim()) + " is not finite in the codec");
  }
  return OkStatus();
}

}  // namespace

bool DevicePresent(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    if (why != nullptr) *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device";
    return false;
  }
  return true;
}

Status Quantize(Codec codec, BlockShape shape, const float* device_in, uint8_t* device_out, size_t blocks,
                void* stream_ptr) {
  if (Status s = ValidateShape(shape); !s.ok()) return s;
  if (blocks == 0) return OkStatus();
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  unsigned long long* first_bad = nullptr;
  if (cudaError_t e = MallocAsync(reinterpret_cast<void**>(&first_bad), sizeof *first_bad, stream); e != cudaSuccess) {
    return CudaError(e, "cuda::Quantize");
  }
  if (cudaError_t e = cudaMemsetAsync(first_bad, 0xff, sizeof *first_bad, stream); e != cudaSuccess) {
    cudaFreeAsync(first_bad, stream);
    return CudaError(e, "cuda::Quantize");
  }
  const size_t n = shape.values() * blocks;
  switch (codec) {
    case Codec::kBf16:
      QuantizeBf16Kernel<<<(n + 255) / 256, 256, 0, stream>>>(device_in, reinterpret_cast<uint16_t*>(device_out), n,
                                                              first_bad);
      break;
    case Codec::kInt8:
      QuantizeInt8Kernel<<<blocks, 256, 0, stream>>>(device_in, device_out, shape.tokens, shape.dim(),
                                                     EncodedBytes(codec, shape), first_bad);
      break;
    case Codec::kInt4:
      QuantizeInt4Kernel<<<blocks, 256, 0, stream>>>(device_in, device_out, shape.tokens, shape.dim(),
                                                     EncodedBytes(codec, shape), first_bad);
      break;
    case Codec::kFp8: {
      const uint32_t tiles = (shape.latent_dim + kFp8TileSize - 1) / kFp8TileSize;
      const size_t items = size_t{shape.tokens} * blocks * (tiles + 1);
      QuantizeFp8Kernel<<<(items + 127) / 128, 128, 0, stream>>>(
          device_in, device_out, size_t{shape.tokens} * blocks, shape.latent_dim, shape.rope_dim, tiles,
          EncodedBytes(codec, {1, shape.latent_dim, shape.rope_dim}), first_bad);
      break;
    }
    default:
      cudaFreeAsync(first_bad, stream);
      return Status(StatusCode::kInvalidArgument, "unknown codec");
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    cudaFreeAsync(first_bad, stream);
    return CudaError(e, "cuda::Quantize launch");
  }
  return Finish(stream, first_bad, shape, "cuda::Quantize");
}

Status Dequantize(Codec codec, BlockShape shape, const uint8_t* device_in, float* device_out, size_t blocks,
                  void* stream_ptr) {
  if (Status s = ValidateShape(shape); !s.ok()) return s;
  if (blocks == 0) return OkStatus();
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const size_t n = shape.values() * blocks;
  switch (codec) {
    case Codec::kBf16:
      DequantizeBf16Kernel<<<(n + 255) / 256, 256, 0, stream>>>(reinterpret_cast<const uint16_t*>(device_in),
                                                                device_out, n);
      break;
    case Codec::kInt8:
      DequantizeInt8Kernel<<<blocks, 256, 0, stream>>>(device_in, device_out, shape.tokens, shape.dim(),
                                                       EncodedBytes(codec, shape));
      break;
    case Codec::kInt4:
      DequantizeInt4Kernel<<<blocks, 256, 0, stream>>>(device_in, device_out, shape.tokens, shape.dim(),
                                                       EncodedBytes(codec, shape));
      break;
    case Codec::kFp8: {
      const uint32_t tiles = (shape.latent_dim + kFp8TileSize - 1) / kFp8TileSize;
      DequantizeFp8Kernel<<<(n + 255) / 256, 256, 0, stream>>>(device_in, device_out, size_t{shape.tokens} * blocks,
                                                              shape.latent_dim, shape.rope_dim, tiles,
                                                              EncodedBytes(codec, {1, shape.latent_dim, shape.rope_dim}));
      break;
    }
    default:
      return InvalidArgument("unknown codec");
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return CudaError(e, "cuda::Dequantize launch");
  return Finish(stream, nullptr, shape, "cuda::Dequantize");
}

}  // namespace kvtier::kernels::cuda
