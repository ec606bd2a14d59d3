// 16 floats as one GCC vector, for loops built for AVX-512 (one zmm), and
// as two 8-float halves, for loops built for every x86-64 level (target
// clones): without AVX-512 GCC has no register for a 64-byte vector, so it
// keeps such values on the stack, with a store and a load on every step,
// while each half is one ymm (two xmm on baseline x86-64). Private to
// kernels/cpu.
#ifndef KVTIER_KERNELS_CPU_LANES16_H_
#define KVTIER_KERNELS_CPU_LANES16_H_

#include <cstdint>
#include <cstring>

namespace kvtier::kernels::cpu {

typedef float Lanes16 __attribute__((vector_size(64)));
typedef float Lanes8 __attribute__((vector_size(32)));

// Always inlined into the function being built, so the vector never
// crosses a call: GCC's note that its return ABI differs without AVX-512
// (or AVX, for the halves) does not apply.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
__attribute__((always_inline)) inline Lanes16 Load16(const float* p) {
  Lanes16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// 16 bf16 values widened to floats (exactly: a bf16 is a float's top half).
__attribute__((always_inline)) inline Lanes16 Load16(const uint16_t* p) {
  typedef uint16_t Bf16Lanes16 __attribute__((vector_size(32)));
  typedef uint32_t Bits16 __attribute__((vector_size(64)));
  Bf16Lanes16 h;
  std::memcpy(&h, p, sizeof h);
  const Bits16 bits = __builtin_convertvector(h, Bits16) << 16;
  Lanes16 v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

__attribute__((always_inline)) inline Lanes8 Load8(const float* p) {
  Lanes8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// 8 bf16 values widened to floats.
__attribute__((always_inline)) inline Lanes8 Load8(const uint16_t* p) {
  typedef uint16_t Bf16Lanes8 __attribute__((vector_size(16)));
  typedef uint32_t Bits8 __attribute__((vector_size(32)));
  Bf16Lanes8 h;
  std::memcpy(&h, p, sizeof h);
  const Bits8 bits = __builtin_convertvector(h, Bits8) << 16;
  Lanes8 v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
#pragma GCC diagnostic pop

}  // namespace kvtier::kernels::cpu

#endif  // KVTIER_KERNELS_CPU_LANES16_H_
