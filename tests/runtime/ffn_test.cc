// MoeForward over a batch against a float64 re-computation row by row
// (DeepSeek-V2's gate from tests/reference, SwiGLU in double), with its
// experts spread over several kernel threads, and the same bits with one.
#include "services/runtime/ffn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/parallel.h"
#include "tests/reference/deepseek_math.h"
#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

SwiGluWeights RandomSwiGlu(size_t inter, size_t hidden, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(hidden)));
  SwiGluWeights w;
  w.inter = inter;
  for (WeightMatrix* m : {&w.gate, &w.up, &w.down}) {
    m->f32.resize(inter * hidden);
    for (float& v : m->f32) v = normal(rng);
  }
  return w;
}

double At(const WeightMatrix& m, size_t k) { return m.bf16.empty() ? m.f32[k] : kernels::Bf16ToFloat(m.bf16[k]); }

// The same weights rounded to bf16 and kept that way; `widened` gets them
// back as floats.
void ToBf16(WeightMatrix& m, WeightMatrix& widened) {
  widened = {};
  for (float v : m.f32) {
    m.bf16.push_back(kernels::FloatToBf16(v));
    widened.f32.push_back(kernels::Bf16ToFloat(m.bf16.back()));
  }
  m.f32.clear();
}

// sum_e weight_e * SwiGLU_e(x) in double.
void AddSwiGlu(const SwiGluWeights& w, size_t hidden, const float* x, double weight, std::vector<double>& out) {
  std::vector<double> act(w.inter);
  for (size_t i = 0; i < w.inter; ++i) {
    double g = 0, u = 0;
    for (size_t c = 0; c < hidden; ++c) g += At(w.gate, i * hidden + c) * x[c], u += At(w.up, i * hidden + c) * x[c];
    act[i] = g / (1 + std::exp(-g)) * u;
  }
  for (size_t j = 0; j < hidden; ++j) {
    double y = 0;
    for (size_t i = 0; i < w.inter; ++i) y += At(w.down, j * w.inter + i) * act[i];
    out[j] += weight * y;
  }
}

constexpr size_t kHidden = 48, kExperts = 8, kInter = 24, kRows = 13;

MoeWeights RandomMoe(std::mt19937_64& rng) {
  MoeWeights moe;
  moe.gate = {.top_k = 3,
              .group_limited = true,
              .n_group = 4,
              .topk_group = 2,
              .norm_topk_prob = false,
              .routed_scaling_factor = 1.5f};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  moe.router.resize(kExperts * kHidden);
  for (float& v : moe.router) v = normal(rng) * 0.5f;
  for (size_t e = 0; e < kExperts; ++e) moe.experts.push_back(RandomSwiGlu(kInter, kHidden, rng));
  moe.shared = RandomSwiGlu(2 * kInter, kHidden, rng);
  return moe;
}

// 13 rows: a few an expert (the experts run as jobs); 120: many (each
// expert's products split instead).
std::vector<float> RandomRows(std::mt19937_64& rng, size_t rows = kRows) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * kHidden);
  for (float& v : x) v = normal(rng);
  return x;
}

// MoeForward's output with `threads` kernel threads.
std::vector<float> MoeWithThreads(const MoeWeights& moe, const std::vector<float>& x, size_t threads) {
  std::vector<float> out(x.size(), NAN);
  kernels::SetKernelThreads(threads);
  MoeForward(moe, kHidden, x.data(), x.size() / kHidden, out.data());
  kernels::SetKernelThreads(1);
  return out;
}

// The chosen experts spread over the kernel threads (as jobs with a few
// rows an expert, by splitting each one's products with many); their sums
// into a row still come in expert order, so any thread count gives the
// same bits.
TEST(MoeForward, BatchMatchesFloat64PerRowOnAnyThreadCount) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const MoeWeights moe = RandomMoe(rng.engine());
  for (size_t rows : {kRows, size_t{120}}) {
    const std::vector<float> x = RandomRows(rng.engine(), rows);
    const std::vector<float> out = MoeWithThreads(moe, x, 3);
    for (size_t threads : {1, 2, 5})
      EXPECT_EQ(MoeWithThreads(moe, x, threads), out) << rows << " rows, " << threads << " threads";
    for (size_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * kHidden;
      std::vector<float> logits(kExperts);
      kernels::Gemv(moe.router.data(), kExperts, kHidden, xr, logits.data());
      std::vector<double> want(kHidden, 0.0);
      for (auto [e, weight] : kernels::ReferenceGate(logits, moe.gate))
        AddSwiGlu(moe.experts[e], kHidden, xr, weight, want);
      AddSwiGlu(moe.shared, kHidden, xr, 1.0, want);
      for (size_t j = 0; j < kHidden; ++j) {
        ASSERT_NEAR(out[r * kHidden + j], want[j], 1e-5 * (1 + std::fabs(want[j])))
            << rows << " rows: row " << r << " dim " << j;
      }
    }
  }
  // Weight bytes: router + 3 experts' matrices + shared.
  EXPECT_EQ(MoeWeightBytes(moe, 3), 4 * (kExperts * kHidden + 3 * 3 * kInter * kHidden + 3 * 2 * kInter * kHidden));
}

// Experts kept in bf16 (as a bf16 checkpoint loads): the bits of the same
// weights widened to float, and half their bytes.
TEST(MoeForward, Bf16WeightsGiveTheBitsOfTheirFloatValues) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  MoeWeights bf16 = RandomMoe(rng.engine());
  MoeWeights widened = bf16;
  for (size_t e = 0; e <= kExperts; ++e) {
    SwiGluWeights& b = e < kExperts ? bf16.experts[e] : bf16.shared;
    SwiGluWeights& f = e < kExperts ? widened.experts[e] : widened.shared;
    ToBf16(b.gate, f.gate), ToBf16(b.up, f.up), ToBf16(b.down, f.down);
  }
  const std::vector<float> x = RandomRows(rng.engine());
  EXPECT_EQ(MoeWithThreads(bf16, x, 3), MoeWithThreads(widened, x, 1));
  EXPECT_EQ(MoeWeightBytes(bf16, 3),
            4 * kExperts * kHidden + 2 * (3 * 3 * kInter * kHidden + 3 * 2 * kInter * kHidden));
}

}  // namespace
}  // namespace kvtier::runtime
