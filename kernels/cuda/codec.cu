// The bf16 and int8 codecs as CUDA kernels. Every rounding goes through the
// same functions as the CPU codecs (float_formats.h) or an explicitly
// rounded CUDA intrinsic, and nvcc's FMA contraction is off for this file
// (as -ffp-contract=off is for the CPU codecs), so the bytes are the CPU's.
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "kvtier/kernels/cuda_codec.h"
#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels::cuda {
namespace {

constexpr unsigned long long kNoBadValue = ~0ull;

Status CudaError(cudaError_t e, const char* what) {
  return Status(StatusCode::kInternal, std::string(what) + ": " + cudaGetErrorString(e));
}

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
  if (cudaError_t e = cudaMallocAsync(&first_bad, sizeof *first_bad, stream); e != cudaSuccess) {
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
    default:
      cudaFreeAsync(first_bad, stream);
      return Status(StatusCode::kUnimplemented, std::string("no CUDA quantizer for ") + CodecName(codec) + " yet");
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
    default:
      return Status(StatusCode::kUnimplemented, std::string("no CUDA dequantizer for ") + CodecName(codec) + " yet");
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return CudaError(e, "cuda::Dequantize launch");
  return Finish(stream, nullptr, shape, "cuda::Dequantize");
}

}  // namespace kvtier::kernels::cuda
