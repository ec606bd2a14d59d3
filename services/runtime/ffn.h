// The feed-forward half of a DeepSeek-V2/V3 layer over a batch of rows: a
// SwiGLU MLP (dense layers, each expert, the shared experts) and the MoE
// that routes each row to its top-k experts. Weights row-major, bf16 or
// float32 (WeightMatrix), activations float32.
#ifndef KVTIER_SERVICES_RUNTIME_FFN_H_
#define KVTIER_SERVICES_RUNTIME_FFN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvtier/kernels/layers.h"
#include "services/runtime/matmul.h"

namespace kvtier::runtime {

// down(silu(gate x) * up x); gate and up are [inter][hidden], down
// [hidden][inter]. DeepSeek-V4's experts differ in three ways, each set
// here: with a limit (swiglu_limit) gate x is clamped to at most it and
// up x to [-limit, limit]; a routed expert's weight scales its
// intermediate, before down, not its output; and products over FP8 or
// FP4 weights round their inputs to FP8 first (blocks of 128, power-of-two
// scales), as its quantized GEMMs do.
struct SwiGluWeights {
  size_t inter = 0;
  WeightMatrix gate, up, down;
  float limit = 0.0f;  // 0: no clamp
  bool weight_before_down = false;
  bool round_inputs = false;  // over FP8 or FP4 weights (MatMulRoundingInputs)
};

// For each of the n rows of x ([n][hidden]):
// out[out_rows[i]] += weights[i] * SwiGLU(x_i); no out_rows means row i, no
// weights means 1. Each weight matrix is read once for all rows.
void SwiGluForward(const SwiGluWeights& w, size_t hidden, const float* x, size_t n, const float* weights,
                   const uint32_t* out_rows, float* out);

struct MoeWeights {
  std::vector<float> router;           // [experts][hidden]
  std::vector<float> correction_bias;  // noaux_tc's, [experts]; gate.correction_bias points here
  std::vector<SwiGluWeights> experts;
  SwiGluWeights shared;  // inter 0: no shared experts
  kernels::GateParams gate;
};

// out[n][hidden] = routed experts (weighted by the gate) + shared experts.
// Rows are grouped by expert so each chosen expert's weights are read once
// per batch. `gate` must have been validated against the expert count.
void MoeForward(const MoeWeights& w, size_t hidden, const float* x, size_t n, float* out);

// The same with the routing already done: chosen[i] are row i's experts
// and weights (w.router and w.gate unused).
void MoeForwardRouted(const MoeWeights& w, size_t hidden, const float* x, size_t n,
                      const std::vector<std::vector<kernels::ExpertChoice>>& chosen, float* out);

// Weight bytes MoeForward reads for rows choosing `experts_touched`
// distinct experts: router, those experts and the shared experts.
size_t MoeWeightBytes(const MoeWeights& w, size_t experts_touched);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_FFN_H_
