// Small per-token operations of a DeepSeek-V2 layer, CPU reference
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

// x[i] = e_i / sum_j e_j with e_i = exp(scale * (x[i] - max)), in place,
// for n >= 1 finite scores and scale > 0: attention's softmax of scaled
// scores. With AVX-512 sixteen at a time through a polynomial exp (within
// 2 ulp of expf), elsewhere expf.
void Softmax(float* x, size_t n, float scale = 1.0f);

// out = x / sqrt(mean(x^2) + eps) * weight. `out` may alias `x`.
Status RmsNorm(std::span<const float> x, std::span<const float> weight, float eps, std::span<float> out);

// How the MoE gate picks experts (DeepSeek-V2's DeepseekV2MoEGate).
struct GateParams {
  uint32_t top_k = 1;
  bool group_limited = false;  // topk_method group_limited_greedy
  uint32_t n_group = 1;
  uint32_t topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
};

struct ExpertChoice {
  uint32_t expert;
  float weight;
};

// softmax(logits) over the routed experts, then top_k (within the topk_group
// best groups, a group scored by its best expert, when group_limited); then,
// exactly as DeepSeek-V2 does, weights are renormalised to sum to 1 if
// top_k > 1 and norm_topk_prob, and otherwise multiplied by
// routed_scaling_factor (never both). Ties go to the lower expert index.
// Choices come highest weight first.
Status SelectExperts(std::span<const float> logits, const GateParams& params, std::vector<ExpertChoice>& out);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_LAYERS_H_
