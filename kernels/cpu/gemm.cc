// Gemm and Gemv: dot products of weight rows with inputs, each summed in
// one fixed order whatever the batch, the tile or the thread split, so a
// sequence's results do not depend on what it is batched with.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "avx512.h"
#include "codec_internal.h"
#include "gemm_rows.h"
#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/parallel.h"
#include "lanes16.h"

namespace kvtier::kernels {

namespace {

// Helpers of the target-clone functions must be inlined into each clone:
// one left out of line is compiled for the baseline target only, and the
// tile that calls it runs at a fraction of its rate.
#define KVTIER_INLINE __attribute__((always_inline)) inline

using cpu::GemmRowRange;
using cpu::GemmRowRangeWide;
using cpu::kWideFrom;
using cpu::Lanes16;
using cpu::Lanes8;
using cpu::Load16;
using cpu::Load8;

// Load16 returns a 64-byte vector; inlined into each clone it never
// crosses a call, so GCC's note on that ABI does not apply to its callers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
KVTIER_INLINE float WeightAt(const float* row, size_t c) { return row[c]; }
KVTIER_INLINE float WeightAt(const uint16_t* row, size_t c) { return Bf16ToFloat(row[c]); }

// 16 floats (Lanes16) or 8 (Lanes8) of a weight row or an input: into a
// reference, since a template returning the vector is instantiated where
// the note on its ABI is no longer silenced. Unused where the build has no
// wide tiles (WideTiles()), as LaneSums below.
#define KVTIER_WIDE_ONLY [[maybe_unused]] KVTIER_INLINE
KVTIER_WIDE_ONLY void LoadLanes(const float* p, Lanes16& v) { v = Load16(p); }
KVTIER_WIDE_ONLY void LoadLanes(const uint16_t* p, Lanes16& v) { v = Load16(p); }
KVTIER_WIDE_ONLY void LoadLanes(const float* p, Lanes8& v) { v = Load8(p); }
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// Load8's widening of bf16 is built by GCC 12 as two 128-bit widenings
// and an insert, where AVX2 loads and widens in one instruction. Not
// always_inline: GCC refuses that into AccumulateBlock's body, built for
// no target; it is inlined once that body is in GemmRowRangeAvx2.
KVTIER_AVX2 inline void LoadLanes(const uint16_t* p, Lanes8& v) {
  const __m128i bf16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bf16), 16));
}
#else
KVTIER_WIDE_ONLY void LoadLanes(const uint16_t* p, Lanes8& v) { v = Load8(p); }
#endif

template <bool kWide, typename Weight>
KVTIER_INLINE void LoadPart(const Weight* p, Lanes8& v) {
  if constexpr (kWide) {
    LoadLanes(p, v);
  } else {
    v = Load8(p);
  }
}

// Dot products of R weight rows (the k-th at row + k * row_gap rows) with
// M inputs, R and M fixed at compile time. The partial sums are vector
// values, not an array, so that they stay in registers (as a float[M][16]
// array GCC kept them on the stack: a store and reload on every step); 16
// lanes as two halves, since this is built for every x86-64 level
// (lanes16.h; kWide: only for the builds of the wide tiles, whose
// LoadLanes widen bf16 in one instruction). The lanes are summed in a
// fixed order (lane-wise, then lanes 0..15, then the columns past the last
// full lane group), which Gemv repeats and the wide tiles match; several
// rows only run their sums side by side.
template <size_t M, size_t R = 1, bool kWide = false, typename Weight>
KVTIER_INLINE void DotTile(const Weight* row, size_t row_gap, size_t cols, const float* x, size_t x_stride, float* y,
                           size_t y_stride) {
  const size_t full = cols / 16 * 16;
  Lanes8 low[R][M] = {}, high[R][M] = {};  // lanes 0..7 and 8..15
  for (size_t c = 0; c < full; c += 16) {
    for (size_t k = 0; k < R; ++k) {
      Lanes8 w_low, w_high;
      LoadPart<kWide>(row + k * row_gap * cols + c, w_low);
      LoadPart<kWide>(row + k * row_gap * cols + c + 8, w_high);
      for (size_t i = 0; i < M; ++i) {
        low[k][i] += w_low * Load8(x + i * x_stride + c);
        high[k][i] += w_high * Load8(x + i * x_stride + c + 8);
      }
    }
  }
  for (size_t k = 0; k < R; ++k) {
    const Weight* w = row + k * row_gap * cols;
    for (size_t i = 0; i < M; ++i) {
      float s = 0.0f;
      for (size_t j = 0; j < 8; ++j) s += low[k][i][j];
      for (size_t j = 0; j < 8; ++j) s += high[k][i][j];
      // An explicit fma: left to the compiler, the float and bf16 tails were
      // contracted differently (measured: other last bits).
      for (size_t c = full; c < cols; ++c) s = std::fma(WeightAt(w, c), x[i * x_stride + c], s);
      y[i * y_stride + k * row_gap] = s;
    }
  }
}

// R weight rows against M inputs over columns [begin, end) (whole lane
// groups), continuing the lane-wise sums at entries e0.. of `acc` (R x M,
// row-major; from zero when begin is 0): the steps of DotTile's loop, with
// each load of a weight row shared by M inputs and each load of an input
// by R rows. A lane group is one Lanes16 or two Lanes8 (acc[0] holding
// lanes 0..7, acc[1] lanes 8..15), both halves in the same pass so that
// every line read is read whole.
template <size_t R, size_t M, typename Weight, typename Lanes, size_t kParts, size_t kEntries>
KVTIER_INLINE void AccumulateBlock(const Weight* w, size_t cols, size_t begin, size_t end, const float* x,
                                   size_t x_stride, Lanes (&acc)[kParts][kEntries], size_t e0) {
  constexpr size_t kWidth = 16 / kParts;
  Lanes lanes[kParts][R][M];
  for (size_t p = 0; p < kParts; ++p)
    for (size_t r = 0; r < R; ++r)
      for (size_t i = 0; i < M; ++i) lanes[p][r][i] = begin == 0 ? Lanes{} : acc[p][e0 + r * M + i];
  for (size_t c = begin; c < end; c += 16) {
    for (size_t p = 0; p < kParts; ++p) {
      Lanes in[M];
      for (size_t i = 0; i < M; ++i) LoadLanes(x + i * x_stride + c + p * kWidth, in[i]);
      for (size_t r = 0; r < R; ++r) {
        Lanes wr;
        LoadLanes(w + r * cols + c + p * kWidth, wr);
        for (size_t i = 0; i < M; ++i) lanes[p][r][i] += wr * in[i];
      }
    }
  }
  for (size_t p = 0; p < kParts; ++p)
    for (size_t r = 0; r < R; ++r)
      for (size_t i = 0; i < M; ++i) acc[p][e0 + r * M + i] = lanes[p][r][i];
}
#pragma GCC diagnostic pop

// All weight rows against inputs [0, n), four inputs sharing each load of
// a weight row: Gemm's work for one block of inputs. Below four inputs (a
// decode step's matrix-vector products) rows r and r + half run side by
// side, each input in turn while the two rows are in L1: one row's sum is
// a chain of dependent FMAs that leaves memory idle, and two rows far
// apart are two streams the prefetcher follows, where adjacent rows (tried
// before) defeat it.
template <bool kWide = false, typename Weight>
KVTIER_INLINE void GemmRows(const Weight* w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride,
                            float* y, size_t y_stride) {
  if (n < 4) {
    const size_t half = (rows + 1) / 2;
    for (size_t r = 0; r < half; ++r) {
      for (size_t i = 0; i < n; ++i) {
        float* out = y + i * y_stride + r;
        if (r + half < rows) {
          DotTile<1, 2, kWide>(w + r * cols, half, cols, x + i * x_stride, x_stride, out, y_stride);
        } else {
          DotTile<1, 1, kWide>(w + r * cols, 0, cols, x + i * x_stride, x_stride, out, y_stride);
        }
      }
    }
    return;
  }
  for (size_t r = 0; r < rows; ++r) {
    const Weight* row = w + r * cols;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) DotTile<4>(row, 0, cols, x + i * x_stride, x_stride, y + i * y_stride + r, y_stride);
    for (; i < n; ++i) DotTile<1>(row, 0, cols, x + i * x_stride, x_stride, y + i * y_stride + r, y_stride);
  }
}

// Gemm's block of inputs in tiles of kRows weight rows x kInputs inputs,
// the columns in chunks of 1,024 so that a tile's weights stay in L1 while
// the block's inputs pass. The rows past the last whole tile go through
// GemmRows. With AVX-512, 6 x 4 (24 sums in registers: AVX-512's 32 hold
// them with the loads), chosen against 4 x 4 tiles, chunks of 256-2,048
// columns and blocks of 16-64 inputs
// (docs/notes/2026-12-01-benchmark-history.md, "The peaks, measured
// again"). With AVX2's 16 registers, 3 x 2, each sum two halves of 8
// lanes (12 registers), chosen against 2 x 2, 2 x 3, 4 x 2 and, in two
// passes of one half each, 3 x 4 (docs/notes/2026-12-05-avx2-gemm.md).
constexpr size_t kInputBlock = 32;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// sums[k] = (((0 + v[k][0]) + v[k][1]) + ...) + v[k][15] for k < 16,
// DotTile's lane order (so the same bits), sixteen at a time: the vectors
// transposed, then the columns added in lane order (avx512.h's SumEach adds
// in a tree: other bits). One at a time, the
// lane sums weighed most on short rows: 128- and 192-column Gemms (the
// prefill's scores) ran 7-9% slower.
KVTIER_AVX512 void LaneSums(const Lanes16* v, float* sums) {
  // Per 128-bit lane L, u[4g + m] holds element 4L + m of vectors 4g..4g+3.
  __m512 u[16];
  for (int g = 0; g < 4; ++g) {
    const __m512 lo01 = _mm512_unpacklo_ps(v[4 * g], v[4 * g + 1]), hi01 = _mm512_unpackhi_ps(v[4 * g], v[4 * g + 1]);
    const __m512 lo23 = _mm512_unpacklo_ps(v[4 * g + 2], v[4 * g + 3]),
                 hi23 = _mm512_unpackhi_ps(v[4 * g + 2], v[4 * g + 3]);
    const __m512d l01 = _mm512_castps_pd(lo01), l23 = _mm512_castps_pd(lo23);
    const __m512d h01 = _mm512_castps_pd(hi01), h23 = _mm512_castps_pd(hi23);
    u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(l01, l23));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(l01, l23));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(h01, h23));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(h01, h23));
  }
  // Column 4L + m: lane L of u[m], u[4 + m], u[8 + m], u[12 + m].
  __m512 column[16];
  for (int m = 0; m < 4; ++m) {
    const __m512 a02 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88), a13 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xdd);
    const __m512 b02 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88);
    const __m512 b13 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xdd);
    column[m] = _mm512_shuffle_f32x4(a02, b02, 0x88);
    column[4 + m] = _mm512_shuffle_f32x4(a13, b13, 0x88);
    column[8 + m] = _mm512_shuffle_f32x4(a02, b02, 0xdd);
    column[12 + m] = _mm512_shuffle_f32x4(a13, b13, 0xdd);
  }
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < 16; ++j) sum = _mm512_add_ps(sum, column[j]);
  _mm512_storeu_ps(sums, sum);
}

// The same for the AVX2 tiles, 8 entries whose lanes 0..7 are in low[k]
// and 8..15 in high[k]: each 8 x 8 block transposed, then its columns
// added in lane order.
KVTIER_AVX2 KVTIER_INLINE void Transpose8(const Lanes8* v, __m256 column[8]) {
  __m256 quads[8];  // per 128-bit lane: element m of vectors 4g..4g+3 in quads[4g + m]
  for (int g = 0; g < 2; ++g) {
    const __m256 lo01 = _mm256_unpacklo_ps(v[4 * g], v[4 * g + 1]), hi01 = _mm256_unpackhi_ps(v[4 * g], v[4 * g + 1]);
    const __m256 lo23 = _mm256_unpacklo_ps(v[4 * g + 2], v[4 * g + 3]),
                 hi23 = _mm256_unpackhi_ps(v[4 * g + 2], v[4 * g + 3]);
    quads[4 * g + 0] = _mm256_shuffle_ps(lo01, lo23, 0x44);
    quads[4 * g + 1] = _mm256_shuffle_ps(lo01, lo23, 0xee);
    quads[4 * g + 2] = _mm256_shuffle_ps(hi01, hi23, 0x44);
    quads[4 * g + 3] = _mm256_shuffle_ps(hi01, hi23, 0xee);
  }
  for (int m = 0; m < 4; ++m) {  // lane m from the low 128 bits, lane 4 + m from the high
    column[m] = _mm256_permute2f128_ps(quads[m], quads[4 + m], 0x20);
    column[4 + m] = _mm256_permute2f128_ps(quads[m], quads[4 + m], 0x31);
  }
}

KVTIER_AVX2 void LaneSums(const Lanes8* low, const Lanes8* high, float* sums) {
  __m256 column[8];
  __m256 sum = _mm256_setzero_ps();
  Transpose8(low, column);
  for (int j = 0; j < 8; ++j) sum = _mm256_add_ps(sum, column[j]);
  Transpose8(high, column);
  for (int j = 0; j < 8; ++j) sum = _mm256_add_ps(sum, column[j]);
  _mm256_storeu_ps(sums, sum);
}
#else
[[maybe_unused]] inline void LaneSums(const Lanes16* v, float* sums) {
  for (int k = 0; k < 16; ++k) {
    float s = 0.0f;
    for (int j = 0; j < 16; ++j) s += v[k][j];
    sums[k] = s;
  }
}

[[maybe_unused]] inline void LaneSums(const Lanes8* low, const Lanes8* high, float* sums) {
  for (int k = 0; k < 8; ++k) {
    float s = 0.0f;
    for (int j = 0; j < 8; ++j) s += low[k][j];
    for (int j = 0; j < 8; ++j) s += high[k][j];
    sums[k] = s;
  }
}
#endif

// sums[k]: DotTile's lane sums of entry e0 + k, for k < 16, of the
// accumulators of one part (16 lanes) or two (lanes 0..7, then 8..15).
template <size_t kParts, size_t kEntries, typename Lanes>
KVTIER_INLINE void LaneSumsOf(const Lanes (&acc)[kParts][kEntries], size_t e0, float* sums) {
  if constexpr (kParts == 1) {
    LaneSums(acc[0] + e0, sums);
  } else {
    LaneSums(acc[0] + e0, acc[1] + e0, sums);
    LaneSums(acc[0] + e0 + 8, acc[1] + e0 + 8, sums + 8);
  }
}

template <size_t kRows, size_t kInputs, typename Lanes, typename Weight>
KVTIER_INLINE void GemmRowsWide(const Weight* w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride,
                                float* y, size_t y_stride) {
  constexpr size_t kChunk = 1024;
  constexpr size_t kWidth = sizeof(Lanes) / sizeof(float), kParts = 16 / kWidth;
  const size_t full = cols / 16 * 16;
  // Per part, each input tile's [row][input] sums, then each tail input's [row].
  Lanes acc[kParts][kInputBlock * kRows] = {};
  const size_t tiled = n / kInputs * kInputs, entries = n * kRows;
  size_t r0 = 0;
  for (; r0 + kRows <= rows; r0 += kRows) {
    const Weight* tile = w + r0 * cols;
    size_t c = 0;
    do {  // once at least: the first chunk sets the sums (to 0 when cols < 16)
      const size_t c_end = std::min(full, c + kChunk);
      size_t i = 0;
      for (; i + kInputs <= n; i += kInputs)
        AccumulateBlock<kRows, kInputs>(tile, cols, c, c_end, x + i * x_stride, x_stride, acc, i * kRows);
      for (; i < n; ++i) AccumulateBlock<kRows, 1>(tile, cols, c, c_end, x + i * x_stride, x_stride, acc, i * kRows);
      c += kChunk;
    } while (c < full);
    // The tile's dot products from their lane sums, then the columns past
    // the last lane group, as DotTile does for one.
    for (size_t e0 = 0; e0 < entries; e0 += 16) {
      alignas(64) float sums[16];
      LaneSumsOf<kParts>(acc, e0, sums);
      for (size_t e = e0; e < std::min(entries, e0 + 16); ++e) {
        const bool in_tile = e < tiled * kRows;
        const size_t r = in_tile ? e % (kRows * kInputs) / kInputs : e % kRows;
        const size_t i = in_tile ? e / (kRows * kInputs) * kInputs + e % kInputs : e / kRows;
        float s = sums[e - e0];
        for (size_t c = full; c < cols; ++c) s = std::fma(WeightAt(tile + r * cols, c), x[i * x_stride + c], s);
        y[i * y_stride + r0 + r] = s;
      }
    }
  }
  GemmRows(w + r0 * cols, rows - r0, cols, x, n, x_stride, y + r0, y_stride);
}

// Which tiles a build of GemmRowRangeOf takes: GemmRows's (any x86-64
// level), or GemmRowsWide's for AVX-512 or for AVX2.
enum class Tiles { kAnyLevel, kAvx512, kAvx2 };

// Weight rows [row_begin, row_end) against all inputs, the inputs in blocks
// of 32 that stay in L2 while every row passes over them (2,048 inputs
// would otherwise be re-read from memory per row). A clones function of
// its own: the parallel chunks call it from lambdas, which would otherwise
// be compiled for the baseline target only.
template <Tiles kTiles, typename Weight>
KVTIER_INLINE void GemmRowRangeOf(const Weight* w, size_t row_begin, size_t row_end, size_t cols, const float* x,
                                  size_t n, size_t x_stride, float* y, size_t y_stride) {
  for (size_t i0 = 0; i0 < n; i0 += kInputBlock) {
    const size_t block = std::min(kInputBlock, n - i0);
    const Weight* rows = w + row_begin * cols;
    const size_t count = row_end - row_begin;
    float* out = y + i0 * y_stride + row_begin;
    if constexpr (kTiles == Tiles::kAnyLevel) {
      GemmRows(rows, count, cols, x + i0 * x_stride, block, x_stride, out, y_stride);
    } else if (block < kWideFrom) {
      // Matrix-vector products: AVX2's bf16 widening, 8 lanes a load (16
      // with AVX-512 ran float weights slower).
      GemmRows<true>(rows, count, cols, x + i0 * x_stride, block, x_stride, out, y_stride);
    } else if constexpr (kTiles == Tiles::kAvx512) {
      GemmRowsWide<6, 4, Lanes16>(rows, count, cols, x + i0 * x_stride, block, x_stride, out, y_stride);
    } else {
      GemmRowsWide<3, 2, Lanes8>(rows, count, cols, x + i0 * x_stride, block, x_stride, out, y_stride);
    }
  }
}

// The wide tiles' own builds, for the CPUs that run them; in builds
// without them (WideTiles() is false), GemmRows's, never a stub that leaves
// y unwritten.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVTIER_AVX512_TILES KVTIER_AVX512
#define KVTIER_AVX2_TILES KVTIER_AVX2
constexpr Tiles kAvx512Tiles = Tiles::kAvx512, kAvx2Tiles = Tiles::kAvx2;
#else
#define KVTIER_AVX512_TILES
#define KVTIER_AVX2_TILES
constexpr Tiles kAvx512Tiles = Tiles::kAnyLevel, kAvx2Tiles = Tiles::kAnyLevel;
#endif
constexpr bool kWideTiles = kAvx512Tiles != Tiles::kAnyLevel;

template <typename Weight>
KVTIER_AVX512_TILES void GemmRowRangeAvx512(const Weight* w, size_t row_begin, size_t row_end, size_t cols,
                                            const float* x, size_t n, size_t x_stride, float* y, size_t y_stride) {
  GemmRowRangeOf<kAvx512Tiles>(w, row_begin, row_end, cols, x, n, x_stride, y, y_stride);
}
template <typename Weight>
KVTIER_AVX2_TILES void GemmRowRangeAvx2(const Weight* w, size_t row_begin, size_t row_end, size_t cols, const float* x,
                                        size_t n, size_t x_stride, float* y, size_t y_stride) {
  GemmRowRangeOf<kAvx2Tiles>(w, row_begin, row_end, cols, x, n, x_stride, y, y_stride);
}

template <typename Weight>
void GemmRowRangeWideOf(const Weight* w, size_t row_begin, size_t row_end, size_t cols, const float* x, size_t n,
                        size_t x_stride, float* y, size_t y_stride) {
  if (cpu::HasAvx512()) {
    GemmRowRangeAvx512(w, row_begin, row_end, cols, x, n, x_stride, y, y_stride);
  } else {
    GemmRowRangeAvx2(w, row_begin, row_end, cols, x, n, x_stride, y, y_stride);
  }
}
}  // namespace

// The row ranges Gemm splits its work into, for float and bf16 weights;
// gemm_fp8.cc calls the float ones on the rows it widens.
namespace cpu {

bool WideTiles() { return kWideTiles && (HasAvx512() || HasAvx2()); }

KVTIER_VECTOR_CLONES void GemmRowRange(const float* w, size_t row_begin, size_t row_end, size_t cols, const float* x,
                                       size_t n, size_t x_stride, float* y, size_t y_stride) {
  GemmRowRangeOf<Tiles::kAnyLevel>(w, row_begin, row_end, cols, x, n, x_stride, y, y_stride);
}
KVTIER_VECTOR_CLONES void GemmRowRange(const uint16_t* w, size_t row_begin, size_t row_end, size_t cols, const float* x,
                                       size_t n, size_t x_stride, float* y, size_t y_stride) {
  GemmRowRangeOf<Tiles::kAnyLevel>(w, row_begin, row_end, cols, x, n, x_stride, y, y_stride);
}
void GemmRowRangeWide(const float* w, size_t row_begin, size_t row_end, size_t cols, const float* x, size_t n,
                      size_t x_stride, float* y, size_t y_stride) {
  GemmRowRangeWideOf(w, row_begin, row_end, cols, x, n, x_stride, y, y_stride);
}
void GemmRowRangeWide(const uint16_t* w, size_t row_begin, size_t row_end, size_t cols, const float* x, size_t n,
                      size_t x_stride, float* y, size_t y_stride) {
  GemmRowRangeWideOf(w, row_begin, row_end, cols, x, n, x_stride, y, y_stride);
}

}  // namespace cpu

namespace {

// Gemm's split of the weight rows among the kernel threads: about 1 M
// multiply-adds a chunk (with one input row, as in a single sequence's
// decode step, 4 MB of float weights, far more than waking a thread
// costs); each output is still one dot product in one thread, so results
// do not depend on the split.
template <typename Weight>
void GemmOf(const Weight* w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
            size_t y_stride) {
  const size_t per_row = std::max<size_t>(cols * n, 1);
  const bool wide = cpu::WideTiles();
  ParallelFor(rows, std::max<size_t>((size_t{1} << 20) / per_row, 8), [&](size_t begin, size_t end) {
    if (wide) {
      GemmRowRangeWide(w, begin, end, cols, x, n, x_stride, y, y_stride);
    } else {
      GemmRowRange(w, begin, end, cols, x, n, x_stride, y, y_stride);
    }
  });
}

}  // namespace

void Gemm(const float* w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
          size_t y_stride) {
  GemmOf(w, rows, cols, x, n, x_stride, y, y_stride);
}

void GemmBf16(const uint16_t* w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
              size_t y_stride) {
  GemmOf(w, rows, cols, x, n, x_stride, y, y_stride);
}

// Absorbed attention calls this per token with one row: no tile loop.
KVTIER_VECTOR_CLONES void Gemv(const float* w, size_t rows, size_t cols, const float* x, float* y) {
  for (size_t r = 0; r < rows; ++r) DotTile<1>(w + r * cols, 0, cols, x, cols, y + r, 1);
}

}  // namespace kvtier::kernels
