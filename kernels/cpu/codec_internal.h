// Per-codec CPU implementations behind kernels/codec.h. Callers (codec.cc)
// have already checked the shape and every buffer size.
#ifndef KVTIER_KERNELS_CPU_CODEC_INTERNAL_H_
#define KVTIER_KERNELS_CPU_CODEC_INTERNAL_H_

#include <bit>
#include <cstdint>
#include <cstring>

#include "kvtier/kernels/codec.h"

namespace kvtier::kernels::cpu {

static_assert(std::endian::native == std::endian::little, "the block format is little-endian and stored as-is");

// The hot loops are plain C++ that compilers vectorize; on x86-64 GCC builds
// each such function for AVX-512, AVX2 and baseline SSE2 and picks one when
// the program loads, so one binary is both portable and fast. Not under
// ThreadSanitizer: its instrumented resolvers would run before its runtime.
// Where the build names its x86-64 level (KVTIER_ARCH), the one build of
// that level, kept out of line as the clones are (inlined into its callers,
// some loops were no longer vectorized, and the build measured other code).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(KVTIER_NO_CLONES)
#define KVTIER_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#elif defined(KVTIER_NO_CLONES)
#define KVTIER_VECTOR_CLONES __attribute__((noinline))
#else
#define KVTIER_VECTOR_CLONES
#endif

// Rounds to the nearest integer, ties to even, for |v| < 2^22. Plain
// arithmetic so that compilers vectorize it on every x86-64 level.
inline float RoundHalfEven(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

// INVALID_ARGUMENT naming the first non-finite input value, or OK.
Status CheckFinite(BlockShape shape, const float* in);

// Little-endian stores and loads into unaligned byte buffers.
inline void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }
inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

Status QuantizeBf16(BlockShape shape, const float* in, uint8_t* out);
void DequantizeBf16(BlockShape shape, const uint8_t* in, float* out);
Status QuantizeFp8(BlockShape shape, const float* in, uint8_t* out);
void DequantizeFp8(BlockShape shape, const uint8_t* in, float* out);
Status QuantizeInt8(BlockShape shape, const float* in, uint8_t* out);
void DequantizeInt8(BlockShape shape, const uint8_t* in, float* out);
Status QuantizeInt4(BlockShape shape, const float* in, uint8_t* out);
void DequantizeInt4(BlockShape shape, const uint8_t* in, float* out);

}  // namespace kvtier::kernels::cpu

#endif  // KVTIER_KERNELS_CPU_CODEC_INTERNAL_H_
