// Gemm's work on a range of weight rows (gemm.cc), shared with the
// products that widen their weights into float rows first (gemm_fp8.cc).
// Private to kernels/cpu.
#ifndef KVTIER_KERNELS_CPU_GEMM_ROWS_H_
#define KVTIER_KERNELS_CPU_GEMM_ROWS_H_

#include <cstddef>
#include <cstdint>

namespace kvtier::kernels::cpu {

// Below 4 inputs a tile would be all tail: each input takes two weight
// rows far apart at a time (adjacent rows, two streams 4 KB apart, defeat
// the prefetcher: docs/notes/2026-12-05-matrix-vector-rows.md); from 4,
// where WideTiles(), Gemm takes the wide tiles.
inline constexpr size_t kWideFrom = 4;

// Weight rows [row_begin, row_end) of w ([rows][cols], float or bf16)
// against all n inputs, into y's columns row_begin..row_end: with the
// tiles built for every x86-64 level, or (GemmRowRangeWide, only where
// WideTiles()) with the wide ones of AVX-512 or AVX2. The same bits either
// way, as Gemm's.
// True where this CPU runs the wide tiles: it has AVX-512 or AVX2, and
// this is GCC's x86-64 build.
bool WideTiles();

void GemmRowRange(const float* w, size_t row_begin, size_t row_end, size_t cols, const float* x, size_t n,
                  size_t x_stride, float* y, size_t y_stride);
void GemmRowRange(const uint16_t* w, size_t row_begin, size_t row_end, size_t cols, const float* x, size_t n,
                  size_t x_stride, float* y, size_t y_stride);
void GemmRowRangeWide(const float* w, size_t row_begin, size_t row_end, size_t cols, const float* x, size_t n,
                      size_t x_stride, float* y, size_t y_stride);
void GemmRowRangeWide(const uint16_t* w, size_t row_begin, size_t row_end, size_t cols, const float* x, size_t n,
                      size_t x_stride, float* y, size_t y_stride);

}  // namespace kvtier::kernels::cpu

#endif  // KVTIER_KERNELS_CPU_GEMM_ROWS_H_
