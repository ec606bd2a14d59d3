// AVX-512 pieces the CPU kernels share: the build target and the check
// that this CPU runs it (and the same two for AVX2), tail masks, and the attention kernels' register
// tiles (4 x 4 accumulators as named variables a##h##k, h the tile's row,
// k its column; one step of a tile; a 16-way horizontal sum, and AVX2's
// 8-way one). Private to kernels/cpu.
#ifndef KVTIER_KERNELS_CPU_AVX512_H_
#define KVTIER_KERNELS_CPU_AVX512_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace kvtier::kernels::cpu {

// True when this CPU runs x86-64-v4 (AVX-512 F, BW, CD, DQ, VL), the
// target of KVTIER_AVX512 functions, and KVTIER_NO_AVX512 is not set (so
// that tests can run the other paths on a machine that has it).
#if defined(__x86_64__) && defined(__GNUC__)
inline bool HasAvx512() {
#if defined(__clang__)  // clang 14 knows the features, not the level
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl");
#else
  static const bool cpu = __builtin_cpu_supports("x86-64-v4");
#endif
  static const bool has = cpu && std::getenv("KVTIER_NO_AVX512") == nullptr;
  return has;
}

// True when this CPU runs x86-64-v3 (AVX2, FMA, F16C), the target of
// KVTIER_AVX2 functions.
inline bool HasAvx2() {
#if defined(__clang__)  // clang 14 cannot ask for F16C (every AVX2 and FMA CPU has it)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  static const bool has = __builtin_cpu_supports("x86-64-v3");
#endif
  return has;
}
#else
inline bool HasAvx512() { return false; }
inline bool HasAvx2() { return false; }
#endif

}  // namespace kvtier::kernels::cpu

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 unpack intrinsics pass an undefined vector as their
// unused merge source, which -Wmaybe-uninitialized reports at each use.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#define KVTIER_AVX512 __attribute__((target("arch=x86-64-v4")))

// A file built for AVX2 already (KVTIER_ARCH, ThreadSanitizer's builds)
// takes no attribute: its intrinsics, made for the whole file's level,
// would not inline into a function made for less.
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define KVTIER_AVX2
#else
#define KVTIER_AVX2 __attribute__((target("arch=x86-64-v3")))
#endif

// The 16 accumulators are named variables: as an array GCC 12 copied most
// of them between two sets of registers on every step (up to 32 moves for
// 16 multiply-adds).
#define KVTIER_TILE_ROW(X, h) X(h, 0) X(h, 1) X(h, 2) X(h, 3)
#define KVTIER_TILE(X) KVTIER_TILE_ROW(X, 0) KVTIER_TILE_ROW(X, 1) KVTIER_TILE_ROW(X, 2) KVTIER_TILE_ROW(X, 3)
#define KVTIER_TILE_LIST(h, k) a##h##k,

// One step of a tile: the columns loaded once as c0..c3 = COLUMN(k), then
// per row h `row` = ROW(h) and OP(h, k) for its 4 accumulators.
#define KVTIER_TILE_STEP(TYPE, COLUMN, ROW, OP)                              \
  const TYPE c0 = COLUMN(0), c1 = COLUMN(1), c2 = COLUMN(2), c3 = COLUMN(3); \
  {                                                                          \
    const TYPE row = ROW(0);                                                 \
    KVTIER_TILE_ROW(OP, 0)                                                   \
  }                                                                          \
  {                                                                          \
    const TYPE row = ROW(1);                                                 \
    KVTIER_TILE_ROW(OP, 1)                                                   \
  }                                                                          \
  {                                                                          \
    const TYPE row = ROW(2);                                                 \
    KVTIER_TILE_ROW(OP, 2)                                                   \
  }                                                                          \
  {                                                                          \
    const TYPE row = ROW(3);                                                 \
    KVTIER_TILE_ROW(OP, 3)                                                   \
  }

namespace kvtier::kernels::cpu {

// Lanes i..i+15 of n that exist (all 16 but at the end).
KVTIER_AVX512 inline __mmask16 TailMask(size_t n, size_t i) {
  return static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
}

// Sums each of 16 vectors: lane i of the result is the sum of v[i]'s lanes.
KVTIER_AVX512 __attribute__((always_inline)) inline __m512 SumEach(const __m512 v[16]) {
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: a0+a2, b0+b2, a1+a3, b1+b3
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane's sum of 4 vectors
    const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // quads[i] holds vectors 4i..4i+3 in each of its four 128-bit lanes; sum
  // the lanes so that vectors 4i..4i+3 land in lane i.
  const __m512 v01 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 v23 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v01, v23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(v01, v23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// SumEach for AVX2's 8 vectors of 8 lanes.
KVTIER_AVX2 __attribute__((always_inline)) inline __m256 SumEach8(const __m256 v[8]) {
  // Per 128-bit half: lanes 0..3 of v[i] summed in lane i % 4 of quads[i / 4].
  const __m256 quads[2] = {_mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3])),
                           _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]))};
  return _mm256_add_ps(_mm256_permute2f128_ps(quads[0], quads[1], 0x20),
                       _mm256_permute2f128_ps(quads[0], quads[1], 0x31));
}

// Stores the 4 x 4 tile sums of SumEach (lane h * 4 + k) as rows: the
// first n of row h at dst + h * stride, for the rows h < rows.
KVTIER_AVX512 __attribute__((always_inline)) inline void StoreTileRows(__m512 sums, uint32_t rows, uint32_t n,
                                                                       float* dst, size_t stride) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sums);
  for (uint32_t h = 0; h < rows; ++h) {
    _mm_mask_storeu_ps(dst + h * stride, static_cast<__mmask8>((1u << n) - 1), _mm_load_ps(lanes + 4 * h));
  }
}

}  // namespace kvtier::kernels::cpu

#endif
#endif  // KVTIER_KERNELS_CPU_AVX512_H_
