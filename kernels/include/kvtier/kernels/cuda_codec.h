// The latent codecs on the GPU: the same byte layout and rounding as the
// CPU codecs (codec.h), so a block quantized on either side is the same
// bytes. Blocks lie back to back in device memory: `blocks` inputs of
// shape.values() floats, `blocks` outputs of EncodedBytes(codec, shape).
// Built only with CUDA (KVTIER_HAVE_CUDA); callable from plain C++.
#ifndef KVTIER_KERNELS_CUDA_CODEC_H_
#define KVTIER_KERNELS_CUDA_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/status.h"

namespace kvtier::kernels::cuda {

// True when a CUDA device can be used; otherwise false and why.
bool DevicePresent(std::string* why);

// Quantizes on `stream` (a cudaStream_t; null: the default stream) and waits
// for it. INVALID_ARGUMENT for a non-finite input (naming the block, token
// and channel of the first one), as the CPU codec does; INTERNAL for a CUDA
// error, with its message.
Status Quantize(Codec codec, BlockShape shape, const float* device_in, uint8_t* device_out, size_t blocks,
                void* stream);
Status Dequantize(Codec codec, BlockShape shape, const uint8_t* device_in, float* device_out, size_t blocks,
                  void* stream);

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_CODEC_H_
