// GemmFp4: products over MXFP4 weights (DeepSeek-V4's experts), widened a
// panel of rows at a time into floats that Gemm then reads.
#include <algorithm>
#include <vector>

#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/layers.h"

namespace kvtier::kernels {
namespace {

constexpr size_t kFp4Block = 32;
// Rows widened at a time: enough for Gemm's register tiles, few enough
// that the panel stays in L2 while every input passes over it.
constexpr size_t kFp4PanelRows = 16;

}  // namespace

void DequantizeFp4Rows(const Fp4Scaled& w, size_t cols, size_t row_begin, size_t row_end, float* out) {
  for (size_t r = row_begin; r < row_end; ++r) {
    const uint8_t* codes = w.codes + r * cols / 2;
    const float* scales = w.scales + r * (cols / kFp4Block);
    float* row = out + (r - row_begin) * cols;
    for (size_t c = 0; c < cols; c += 2) {
      const float scale = scales[c / kFp4Block];
      row[c] = E2m1ToFloat(codes[c / 2]) * scale;
      row[c + 1] = E2m1ToFloat(static_cast<uint8_t>(codes[c / 2] >> 4)) * scale;
    }
  }
}

void GemmFp4(const Fp4Scaled& w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
             size_t y_stride) {
  std::vector<float> panel(kFp4PanelRows * cols);
  for (size_t r = 0; r < rows; r += kFp4PanelRows) {
    const size_t count = std::min(kFp4PanelRows, rows - r);
    DequantizeFp4Rows(w, cols, r, r + count, panel.data());
    Gemm(panel.data(), count, cols, x, n, x_stride, y + r, y_stride);
  }
}

}  // namespace kvtier::kernels
