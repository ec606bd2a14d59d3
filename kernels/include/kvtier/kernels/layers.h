// Small per-token operations of a DeepSeek-V2/V3 layer, CPU reference
// implementations (float32, as the reference model computes them).
#ifndef KVTIER_KERNELS_LAYERS_H_
#define KVTIER_KERNELS_LAYERS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/kernels/status.h"

namespace kvtier::kernels {

// y[r] = sum_c w[r * cols + c] * x[c]: a row-major matrix times a vector.
// `y` must not alias `w` or `x`.
void Gemv(const float* w, size_t rows, size_t cols, const float* x, float* y);

// Gemv for `n` inputs at once, reading `w` once: for each input i,
// y[i * y_stride + r] = sum_c w[r * cols + c] * x[i * x_stride + c]. Each
// dot product is summed in the same order as Gemv's, so a batch gives
// bit-identical results to one input at a time. `y` must not alias.
void Gemm(const float* w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
          size_t y_stride);

// Gemm with bf16 weights (as checkpoints store them), widened to float as
// they are read: the same bits as Gemm over the widened weights, from half
// the memory.
void GemmBf16(const uint16_t* w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
              size_t y_stride);

// A projection stored as DeepSeek-V3 publishes it: FP8 E4M3 codes
// [rows][cols] and one float32 scale per block of block_rows x block_cols
// (partial blocks at the edges): w[r][c] = fp8(codes[r][c]) *
// scales[r / block_rows][ceil(cols / block_cols) * ... + c / block_cols].
struct Fp8BlockScaled {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  size_t block_rows = 128;
  size_t block_cols = 128;
};

// Gemm over block-scaled FP8 weights, read as FP8 (a quarter of float32's
// bytes) and widened in registers: the same bits as Gemm over the weights
// dequantized to float32 (each weight fp8 x scale, rounded to float). The
// codes must not be E4M3FN's NaN (0x7f, 0xff): a checkpoint's loader
// refuses them.
void GemmFp8(const Fp8BlockScaled& w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
             size_t y_stride);

// Rows [row_begin, row_end) of `w` ([rows][cols]) dequantized into out
// ([row_end - row_begin][cols]), exactly as GemmFp8 reads them.
void DequantizeFp8Rows(const Fp8BlockScaled& w, size_t cols, size_t row_begin, size_t row_end, float* out);

// Weights in MXFP4, as DeepSeek-V4 publishes its routed experts: codes
// [rows][cols / 2] of E2M1, two a byte (the lower column in the low
// nibble, a sign bit over the magnitude's index into 0, 0.5, 1, 1.5, 2, 3,
// 4, 6), and one scale per 32 columns of a row: w[r][c] = e2m1(code) *
// scales[r * (cols / 32) + c / 32]. cols must be a multiple of 32.
struct Fp4Scaled {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
};

// Gemm over MXFP4 weights, read as FP4 (an eighth of float32's bytes) and
// widened a panel of rows at a time: the same bits as Gemm over the
// dequantized weights.
void GemmFp4(const Fp4Scaled& w, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
             size_t y_stride);
void DequantizeFp4Rows(const Fp4Scaled& w, size_t cols, size_t row_begin, size_t row_end, float* out);

// x[i] = e_i / sum_j e_j with e_i = exp(scale * x[i] - scale * max), in
// place, for n >= 1 finite scores and scale > 0: attention's softmax of
// scaled scores, SoftmaxChunk's one chunk divided by its sum. With AVX-512
// sixteen at a time through a polynomial exp (within 2 ulp of expf), with
// AVX2 eight, elsewhere expf.
void Softmax(float* x, size_t n, float scale = 1.0f);

// One chunk of a softmax taken chunk by chunk, so that attention reads its
// context once: `max` holds the largest scaled score of the chunks so far
// (-infinity before the first) and `sum` their exponentials' sum relative
// to it. In place x[i] = exp(scale * x[i] - max'), max' the largest scaled
// score now, and `max`, `sum` move to max'. Returns exp(max - max'), the
// factor by which whatever earlier chunks' exponentials weighted must be
// multiplied. The same conditions and exp as Softmax.
float SoftmaxChunk(float* x, size_t n, float scale, float& max, float& sum);

// out = x / sqrt(mean(x^2) + eps) * weight. `out` may alias `x`.
Status RmsNorm(std::span<const float> x, std::span<const float> weight, float eps, std::span<float> out);

// How the MoE gate picks and weighs experts: DeepSeek-V2's
// DeepseekV2MoEGate (softmax scores), or with noaux_tc DeepSeek-V3's
// (sigmoid scores and a score correction bias).
struct GateParams {
  uint32_t top_k = 1;
  bool group_limited = false;  // only experts of the topk_group best of n_group groups
  uint32_t n_group = 1;
  uint32_t topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  // topk_method noaux_tc: scores are sigmoid(logits); experts are chosen by
  // score + correction_bias (one per expert), groups ranked by the sum of
  // their two best biased scores; weights are the unbiased scores.
  bool noaux_tc = false;
  std::span<const float> correction_bias = {};
};

struct ExpertChoice {
  uint32_t expert;
  float weight;
};

// The top_k experts for one row's router logits, highest choice score
// first, ties to the lower expert index.
// V2 (softmax): scores = softmax(logits), then top_k (within the topk_group
// best groups, a group scored by its best expert, when group_limited; the
// other groups' experts scored 0, as DeepSeek-V2 masks them); then weights
// are renormalised to sum to 1 if top_k > 1 and norm_topk_prob, and
// otherwise multiplied by routed_scaling_factor (never both).
// V3 (noaux_tc): as described at GateParams, the other groups' experts
// excluded outright (-inf, as DeepSeek-V3 masks them: a biased score may be
// negative); weights renormalised if top_k > 1 and norm_topk_prob, and then
// multiplied by routed_scaling_factor.
Status SelectExperts(std::span<const float> logits, const GateParams& params, std::vector<ExpertChoice>& out);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_LAYERS_H_
