// The latent codecs on the GPU: which kernel (codec_kernels.cuh) takes a
// shape, and the finite-input check's answer. Every rounding in the kernels
// goes through the same functions as the CPU codecs (float_formats.h) or an
// explicitly rounded CUDA intrinsic, and nvcc's FMA contraction is off for
// this file (as -ffp-contract=off is for the CPU codecs), so the bytes are
// the CPU's.
#include <cuda_runtime.h>

#include <string>

#include "codec_kernels.cuh"
#include "cuda_status.h"
#include "kvtier/kernels/cuda_codec.h"
#include "stream_memory.h"

namespace kvtier::kernels::cuda {
namespace {

// Whether the 16-byte kernels take this shape and these buffers (and every
// block's scales start 8-byte aligned).
bool Vectorizable(Codec codec, BlockShape shape, const void* a, const void* b) {
  const bool aligned = reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0 &&
                       EncodedBytes(codec, shape) % 8 == 0;
  const bool channels =
      codec == Codec::kFp8 ? shape.latent_dim % kFp8TileSize == 0 && shape.rope_dim % 4 == 0 : shape.dim() % 8 == 0;
  return aligned && channels;
}

Status Finish(cudaStream_t stream, unsigned long long* first_bad, BlockShape shape, const char* what) {
  unsigned long long bad = codec_kernels::kNoBadValue;
  if (first_bad != nullptr) {
    if (cudaError_t e = cudaMemcpyAsync(&bad, first_bad, sizeof bad, cudaMemcpyDeviceToHost, stream);
        e != cudaSuccess) {
      cudaFreeAsync(first_bad, stream);
      return CudaError(e, what);
    }
  }
  if (first_bad != nullptr) cudaFreeAsync(first_bad, stream);
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) return CudaError(e, what);
  if (bad != codec_kernels::kNoBadValue) {
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
  const bool wide = Vectorizable(codec, shape, device_in, device_out);
  switch (codec) {
    case Codec::kBf16:
      if (wide) {
        codec_kernels::QuantizeBf16x8Kernel<<<(n / 8 + 255) / 256, 256, 0, stream>>>(
            device_in, reinterpret_cast<uint16_t*>(device_out), n / 8, first_bad);
        break;
      }
      codec_kernels::QuantizeBf16Kernel<<<(n + 255) / 256, 256, 0, stream>>>(
          device_in, reinterpret_cast<uint16_t*>(device_out), n, first_bad);
      break;
    case Codec::kInt8: {
      codec_kernels::LaunchShape at;
      if (wide && codec_kernels::Int8QuadsLaunch(shape, blocks, &at)) {
        codec_kernels::QuantizeInt8QuadsKernel<<<at.grid, at.block, 0, stream>>>(
            device_in, device_out, shape.tokens, shape.dim(), EncodedBytes(codec, shape), first_bad);
        break;
      }
      codec_kernels::QuantizeInt8Kernel<<<blocks, 256, 0, stream>>>(device_in, device_out, shape.tokens, shape.dim(),
                                                                    EncodedBytes(codec, shape), first_bad);
      break;
    }
    case Codec::kInt4: {
      codec_kernels::LaunchShape at;
      if (wide && codec_kernels::Int4QuadsLaunch(shape, blocks, &at)) {
        codec_kernels::QuantizeInt4QuadsKernel<<<at.grid, at.block, 0, stream>>>(
            device_in, device_out, shape.tokens, shape.dim(), EncodedBytes(codec, shape), first_bad);
        break;
      }
      codec_kernels::QuantizeInt4Kernel<<<blocks, 256, 0, stream>>>(device_in, device_out, shape.tokens, shape.dim(),
                                                                    EncodedBytes(codec, shape), first_bad);
      break;
    }
    case Codec::kFp8: {
      if (wide) {
        const size_t tokens = size_t{shape.tokens} * blocks;
        const codec_kernels::LaunchShape at = codec_kernels::Fp8WarpLaunch(tokens);
        codec_kernels::QuantizeFp8WarpKernel<<<at.grid, at.block, 0, stream>>>(
            device_in, device_out, tokens, shape.latent_dim, shape.rope_dim,
            EncodedBytes(codec, {1, shape.latent_dim, shape.rope_dim}), first_bad);
        break;
      }
      const uint32_t tiles = (shape.latent_dim + kFp8TileSize - 1) / kFp8TileSize;
      const size_t items = size_t{shape.tokens} * blocks * (tiles + 1);
      codec_kernels::QuantizeFp8Kernel<<<(items + 127) / 128, 128, 0, stream>>>(
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
  const bool wide = Vectorizable(codec, shape, device_in, device_out);
  const size_t quads = n / 4;  // the 16-byte kernels' items: a token's 4 channels
  switch (codec) {
    case Codec::kBf16:
      if (wide) {
        codec_kernels::DequantizeBf16x8Kernel<<<(n / 8 + 255) / 256, 256, 0, stream>>>(
            reinterpret_cast<const uint16_t*>(device_in), device_out, n / 8);
        break;
      }
      codec_kernels::DequantizeBf16Kernel<<<(n + 255) / 256, 256, 0, stream>>>(
          reinterpret_cast<const uint16_t*>(device_in), device_out, n);
      break;
    case Codec::kInt8:
      if (wide) {
        codec_kernels::DequantizeInt8QuadsKernel<<<(quads + 255) / 256, 256, 0, stream>>>(
            device_in, device_out, shape.tokens, shape.dim(), EncodedBytes(codec, shape), quads);
        break;
      }
      codec_kernels::DequantizeInt8Kernel<<<blocks, 256, 0, stream>>>(device_in, device_out, shape.tokens, shape.dim(),
                                                                      EncodedBytes(codec, shape));
      break;
    case Codec::kInt4:
      if (wide) {  // items: a token's 4 byte columns
        codec_kernels::DequantizeInt4QuadsKernel<<<(quads / 2 + 255) / 256, 256, 0, stream>>>(
            device_in, device_out, shape.tokens, shape.dim(), EncodedBytes(codec, shape), quads / 2);
        break;
      }
      codec_kernels::DequantizeInt4Kernel<<<blocks, 256, 0, stream>>>(device_in, device_out, shape.tokens, shape.dim(),
                                                                      EncodedBytes(codec, shape));
      break;
    case Codec::kFp8: {
      if (wide) {
        codec_kernels::DequantizeFp8QuadsKernel<<<(quads + 255) / 256, 256, 0, stream>>>(
            device_in, device_out, quads, shape.latent_dim, shape.rope_dim,
            EncodedBytes(codec, {1, shape.latent_dim, shape.rope_dim}));
        break;
      }
      const uint32_t tiles = (shape.latent_dim + kFp8TileSize - 1) / kFp8TileSize;
      codec_kernels::DequantizeFp8Kernel<<<(n + 255) / 256, 256, 0, stream>>>(
          device_in, device_out, size_t{shape.tokens} * blocks, shape.latent_dim, shape.rope_dim, tiles,
          EncodedBytes(codec, {1, shape.latent_dim, shape.rope_dim}));
      break;
    }
    default:
      return InvalidArgument("unknown codec");
  }
  KVTIER_KERNELS_RETURN_IF_ERROR(Launched("cuda::Dequantize launch"));
  return Finish(stream, nullptr, shape, "cuda::Dequantize");
}

}  // namespace kvtier::kernels::cuda
