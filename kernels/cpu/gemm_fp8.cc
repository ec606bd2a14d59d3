// GemmFp8: products over block-scaled FP8 weights (DeepSeek-V3's), read
// as FP8 and widened to float exactly as DequantizeFp8Rows widens them, so
// that every result has Gemm's bits over the dequantized weights.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "avx512.h"
#include "codec_internal.h"
#include "gemm_rows.h"
#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/parallel.h"

namespace kvtier::kernels {

namespace {

using cpu::GemmRowRange;
using cpu::GemmRowRangeWide;
using cpu::kWideFrom;

// Rows of FP8 weights GemmFp8 widens at a time: one wide tile, whose
// floats (a row of DeepSeek-V3's widest projection is 72 KiB) stay in L2
// while every input of the call passes over them. With AVX-512 it does so
// from kFp8PanelFrom inputs, where widening once shares its cost among
// enough inputs; below, widening in registers as each tile reads the codes
// costs less than storing the floats and reading them back.
constexpr size_t kFp8PanelRows = 6, kFp8PanelFrom = 16;

// Row r's scales, one a block of block_cols columns.
inline const float* ScaleRow(const Fp8BlockScaled& w, size_t r, size_t cols) {
  return w.scales + r / w.block_rows * ((cols + w.block_cols - 1) / w.block_cols);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// 16 FP8 E4M3FN codes (no NaN among them) as the fp16 numbers with their
// sign, exponent and mantissa bits: code << 7 puts exponent and mantissa
// at fp16's bits 7..14 and the sign at bit 14 too, and adding the sign bit
// once more carries it to bit 15. Such an fp16 is the code's value times
// 2^-8 (fp16's exponent bias is 15, E4M3's 7; the subnormals line up too),
// and F16C widens it exactly: times 256 x scale, each weight is fp8 x scale
// rounded once, as Fp8E4m3ToFloat(code) x scale.
KVTIER_AVX2 inline __m256i Fp8AsHalves(const uint8_t* codes) {
  const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m256i shifted = _mm256_slli_epi16(bytes, 7);
  return _mm256_add_epi16(shifted, _mm256_and_si256(shifted, _mm256_set1_epi16(0x4000)));
}

// The end of DotTile for the FP8 tiles below: the 16 lane sums of row r in
// lane order, then the columns past the last lane group.
inline float FinishFp8Dot(const float* lanes, const Fp8BlockScaled& w, size_t r, size_t full, size_t cols,
                          const float* x) {
  const uint8_t* codes = w.codes + r * cols;
  const float* scales = ScaleRow(w, r, cols);
  float s = 0.0f;
  for (size_t j = 0; j < 16; ++j) s += lanes[j];
  for (size_t c = full; c < cols; ++c) s = std::fma(Fp8E4m3ToFloat(codes[c]) * scales[c / w.block_cols], x[c], s);
  return s;
}

// DotTile for R rows of block-scaled FP8 weights (rows r, r + row_gap,
// ...), widened in registers as they are read: the same lane-wise
// multiply-adds over the same weights (each fp8 x scale rounded to float)
// in the same order as DotTile over the dequantized rows, so the same bits.
// Blocks must be whole lane groups (block_cols a multiple of 16) so that
// each group has one scale. With AVX2, DotTile's two halves of 8 lanes;
// with AVX-512, side by side in one register.
template <size_t M, size_t R>
KVTIER_AVX2 void DotTileFp8Avx2(const Fp8BlockScaled& w, size_t r, size_t row_gap, size_t cols, const float* x,
                                size_t x_stride, float* y, size_t y_stride) {
  const size_t full = cols / 16 * 16;
  const float* scales[R];
  for (size_t k = 0; k < R; ++k) scales[k] = ScaleRow(w, r + k * row_gap, cols);
  __m256 low[R][M], high[R][M];
  for (size_t k = 0; k < R; ++k)
    for (size_t i = 0; i < M; ++i) low[k][i] = high[k][i] = _mm256_setzero_ps();
  for (size_t c0 = 0, b = 0; c0 < full; c0 += w.block_cols, ++b) {
    __m256 scale256[R];
    for (size_t k = 0; k < R; ++k) scale256[k] = _mm256_set1_ps(scales[k][b] * 256.0f);
    const size_t end = std::min(full, c0 + w.block_cols);
    for (size_t c = c0; c < end; c += 16) {
      for (size_t k = 0; k < R; ++k) {
        const __m256i half = Fp8AsHalves(w.codes + (r + k * row_gap) * cols + c);
        const __m256 w_low = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(half)), scale256[k]);
        const __m256 w_high = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(half, 1)), scale256[k]);
        for (size_t i = 0; i < M; ++i) {
          low[k][i] = _mm256_fmadd_ps(w_low, _mm256_loadu_ps(x + i * x_stride + c), low[k][i]);
          high[k][i] = _mm256_fmadd_ps(w_high, _mm256_loadu_ps(x + i * x_stride + c + 8), high[k][i]);
        }
      }
    }
  }
  for (size_t k = 0; k < R; ++k) {
    for (size_t i = 0; i < M; ++i) {
      alignas(32) float lanes[16];
      _mm256_store_ps(lanes, low[k][i]);
      _mm256_store_ps(lanes + 8, high[k][i]);
      y[i * y_stride + k * row_gap] = FinishFp8Dot(lanes, w, r + k * row_gap, full, cols, x + i * x_stride);
    }
  }
}
template <size_t M, size_t R>
KVTIER_AVX512 void DotTileFp8Avx512(const Fp8BlockScaled& w, size_t r, size_t row_gap, size_t cols, const float* x,
                                    size_t x_stride, float* y, size_t y_stride) {
  const size_t full = cols / 16 * 16;
  const float* scales[R];
  for (size_t k = 0; k < R; ++k) scales[k] = ScaleRow(w, r + k * row_gap, cols);
  __m512 acc[R][M];
  for (size_t k = 0; k < R; ++k)
    for (size_t i = 0; i < M; ++i) acc[k][i] = _mm512_setzero_ps();
  for (size_t c0 = 0, b = 0; c0 < full; c0 += w.block_cols, ++b) {
    __m512 scale256[R];
    for (size_t k = 0; k < R; ++k) scale256[k] = _mm512_set1_ps(scales[k][b] * 256.0f);
    const size_t end = std::min(full, c0 + w.block_cols);
    for (size_t c = c0; c < end; c += 16) {
      for (size_t k = 0; k < R; ++k) {
        const __m512 wk =
            _mm512_mul_ps(_mm512_cvtph_ps(Fp8AsHalves(w.codes + (r + k * row_gap) * cols + c)), scale256[k]);
        for (size_t i = 0; i < M; ++i)
          acc[k][i] = _mm512_fmadd_ps(wk, _mm512_loadu_ps(x + i * x_stride + c), acc[k][i]);
      }
    }
  }
  for (size_t k = 0; k < R; ++k) {
    for (size_t i = 0; i < M; ++i) {
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, acc[k][i]);
      y[i * y_stride + k * row_gap] = FinishFp8Dot(lanes, w, r + k * row_gap, full, cols, x + i * x_stride);
    }
  }
}

// Rows [row_begin, row_end) dequantized into out, 16 weights a step (as
// DequantizeFp8Rows, whose blocks must here be whole lane groups).
KVTIER_AVX512 void DequantizeFp8RowsAvx512(const Fp8BlockScaled& w, size_t cols, size_t row_begin, size_t row_end,
                                           float* out) {
  const size_t full = cols / 16 * 16;
  for (size_t r = row_begin; r < row_end; ++r) {
    const float* scales = ScaleRow(w, r, cols);
    const uint8_t* codes = w.codes + r * cols;
    float* row = out + (r - row_begin) * cols;
    for (size_t c0 = 0, b = 0; c0 < full; c0 += w.block_cols, ++b) {
      const __m512 scale256 = _mm512_set1_ps(scales[b] * 256.0f);
      const size_t end = std::min(full, c0 + w.block_cols);
      for (size_t c = c0; c < end; c += 16) {
        _mm512_storeu_ps(row + c, _mm512_mul_ps(_mm512_cvtph_ps(Fp8AsHalves(codes + c)), scale256));
      }
    }
    for (size_t c = full; c < cols; ++c) row[c] = Fp8E4m3ToFloat(codes[c]) * scales[c / w.block_cols];
  }
}

// GemmRows over FP8 rows [row_begin, row_end) (inputs below the panel's
// kFp8PanelFrom), each weight byte widened in registers as it is read: 4
// inputs at a time against 4 rows with AVX-512 (16 sums in registers), 1
// row with AVX2's 16 registers; one input at a time takes rows r and
// r + half together, as GemmRows does.
template <bool kAvx512>
void GemmRowRangeFp8(const Fp8BlockScaled& w, size_t row_begin, size_t row_end, size_t cols, const float* x, size_t n,
                     size_t x_stride, float* y, size_t y_stride) {
  const auto tile = [&](auto m, auto rows, size_t i, size_t r, size_t row_gap) {
    constexpr size_t kM = decltype(m)::value, kR = decltype(rows)::value;
    if constexpr (kAvx512) {
      DotTileFp8Avx512<kM, kR>(w, r, row_gap, cols, x + i * x_stride, x_stride, y + i * y_stride + r, y_stride);
    } else {
      DotTileFp8Avx2<kM, kR>(w, r, row_gap, cols, x + i * x_stride, x_stride, y + i * y_stride + r, y_stride);
    }
  };
  using One = std::integral_constant<size_t, 1>;
  using Four = std::integral_constant<size_t, 4>;
  using TileRows = std::conditional_t<kAvx512, Four, One>;
  const size_t tiled = n / 4 * 4, half = (row_end - row_begin + 1) / 2;
  size_t r = row_begin;
  if (tiled > 0) {
    for (; r + TileRows::value <= row_end; r += TileRows::value)
      for (size_t i = 0; i < tiled; i += 4) tile(Four(), TileRows(), i, r, 1);
    for (; r < row_end; ++r)
      for (size_t i = 0; i < tiled; i += 4) tile(Four(), One(), i, r, 0);
  }
  if (tiled == n) return;
  for (r = row_begin; r < row_begin + half; ++r) {
    for (size_t i = tiled; i < n; ++i) {
      if (r + half < row_end) {
        tile(One(), std::integral_constant<size_t, 2>(), i, r, half);
      } else {
        tile(One(), One(), i, r, 0);
      }
    }
  }
}
constexpr bool kFp8Tiles = true;
#else
constexpr bool kFp8Tiles = false;
void DequantizeFp8RowsAvx512(const Fp8BlockScaled&, size_t, size_t, size_t, float*) {}
template <bool kAvx512>
void GemmRowRangeFp8(const Fp8BlockScaled&, size_t, size_t, size_t, const float*, size_t, size_t, float*, size_t) {}
#endif

}  // namespace

KVTIER_VECTOR_CLONES void DequantizeFp8Rows(const Fp8BlockScaled& w, size_t cols, size_t row_begin, size_t row_end,
                                            float* out) {
  for (size_t r = row_begin; r < row_end; ++r) {
    const float* scales = ScaleRow(w, r, cols);
    const uint8_t* codes = w.codes + r * cols;
    float* row = out + (r - row_begin) * cols;
    for (size_t c0 = 0, b = 0; c0 < cols; c0 += w.block_cols, ++b) {
      const float scale = scales[b];
      const size_t end = std::min(cols, c0 + w.block_cols);
      for (size_t c = c0; c < end; ++c) row[c] = Fp8E4m3ToFloat(codes[c]) * scale;
    }
  }
}

// Whole-lane-group blocks (DeepSeek's 128 x 128) on a CPU with AVX2 and
// F16C, below kFp8PanelFrom inputs where it has AVX-512: each row widened
// in registers as the dot products read it. Otherwise a panel of rows is
// widened into floats first and goes through Gemm's own tiles, which share
// it among the inputs. The weights must hold no NaN code (Checkpoint
// loading refuses them).
void GemmFp8(const Fp8BlockScaled& w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
             size_t y_stride) {
  const size_t per_row = std::max<size_t>(cols * n, 1);
  const bool in_registers =
      w.block_cols % 16 == 0 && kFp8Tiles && cpu::HasAvx2() && !(n >= kFp8PanelFrom && cpu::HasAvx512());
  const bool wide = !in_registers && n >= kWideFrom && cpu::HasAvx512();
  ParallelFor(rows, std::max<size_t>((size_t{1} << 20) / per_row, 8), [&](size_t begin, size_t end) {
    if (in_registers) {
      if (cpu::HasAvx512()) {
        GemmRowRangeFp8<true>(w, begin, end, cols, x, n, x_stride, y, y_stride);
      } else {
        GemmRowRangeFp8<false>(w, begin, end, cols, x, n, x_stride, y, y_stride);
      }
      return;
    }
    thread_local std::vector<float> panel;
    panel.resize(kFp8PanelRows * cols);
    for (size_t r = begin; r < end; r += kFp8PanelRows) {
      const size_t count = std::min(kFp8PanelRows, end - r);
      if (wide && w.block_cols % 16 == 0) {
        DequantizeFp8RowsAvx512(w, cols, r, r + count, panel.data());
      } else {
        DequantizeFp8Rows(w, cols, r, r + count, panel.data());
      }
      if (wide) {
        GemmRowRangeWide(panel.data(), 0, count, cols, x, n, x_stride, y + r, y_stride);
      } else {
        GemmRowRange(panel.data(), 0, count, cols, x, n, x_stride, y + r, y_stride);
      }
    }
  });
}

}  // namespace kvtier::kernels
