// GPU projections and MoE check, for the device machine (no gtest there):
// cuBLAS bf16 GEMMs (plain and per head), the MoE feed-forward and a dense
// SwiGLU MLP against a float64 reference
// over the same bf16-rounded weights and inputs, on fresh random data.
// Tolerances: each GEMM output within 1e-4 of sum |w||x| (float32 sums in
// another order); each MoE output within 2e-3 of the largest |out| (the
// SwiGLU product is rounded to bf16 before the down projection, where a
// value near a rounding tie may round the other way). Also times a V2-Lite
// projection (2048 -> 3072) at batch 1-256 against the device's copy rate.
// Exit codes: 0 pass, 1 mismatch or CUDA error, 77 no device (ctest: skip).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "check_util.h"
#include "kvtier/kernels/cuda_codec.h"
#include "kvtier/kernels/cuda_matmul.h"
#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/layers.h"

namespace kvtier::kernels {
namespace {

std::vector<uint16_t> RandomBf16(size_t n, float sigma, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<uint16_t> w(n);
  for (uint16_t& v : w) v = FloatToBf16(normal(rng));
  return w;
}

std::vector<float> RandomFloats(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

double Bf(float x) { return Bf16ToFloat(FloatToBf16(x)); }
double Bf(uint16_t bits) { return Bf16ToFloat(bits); }

bool CheckGemm(cuda::Blas& blas, std::mt19937_64& rng) {
  constexpr uint32_t kRows = 3072, kCols = 2048;
  const std::vector<uint16_t> w = RandomBf16(size_t{kRows} * kCols, 0.02f, rng);
  uint16_t* dw = check::ToDevice(w);
  bool ok = true;
  for (uint32_t n : {1u, 7u, 64u}) {
    const std::vector<float> x = RandomFloats(size_t{n} * kCols, rng);
    float* dx = check::ToDevice(x);
    float* dy = check::ToDevice(std::vector<float>(size_t{n} * kRows, NAN));
    const Status s = blas.Gemm(dw, kRows, kCols, dx, n, dy);
    const std::vector<float> y = check::ToHost(dy, size_t{n} * kRows);
    cudaFree(dx), cudaFree(dy);
    if (!s.ok()) {
      std::fprintf(stderr, "Gemm: %s\n", s.message().c_str());
      ok = false;
      break;
    }
    for (uint32_t i = 0; i < n && ok; ++i) {
      for (uint32_t r = 0; r < kRows; ++r) {
        double want = 0, magnitude = 0;
        for (uint32_t c = 0; c < kCols; ++c) {
          const double p = Bf(w[size_t{r} * kCols + c]) * Bf(x[size_t{i} * kCols + c]);
          want += p, magnitude += std::abs(p);
        }
        if (!(std::abs(y[size_t{i} * kRows + r] - want) <= 1e-4 * magnitude)) {
          std::fprintf(stderr, "Gemm n=%u input %u row %u: GPU %g, float64 %g\n", n, i, r, y[size_t{i} * kRows + r],
                       want);
          ok = false;
          break;
        }
      }
    }
  }
  cudaFree(dw);
  return ok;
}

// Per-head products from and into interleaved [n][heads][...] rows: each
// group's outputs match float64, the gaps between groups stay untouched.
bool CheckGroupedGemm(cuda::Blas& blas, std::mt19937_64& rng) {
  constexpr uint32_t kGroups = 4, kRows = 32, kCols = 48, kXGroup = 64, kYGroup = 40, kN = 5;
  constexpr size_t kLdx = size_t{kGroups} * kXGroup, kLdy = size_t{kGroups} * kYGroup;
  const std::vector<uint16_t> w = RandomBf16(size_t{kGroups} * kRows * kCols, 0.1f, rng);
  const std::vector<float> x = RandomFloats(kN * kLdx, rng);
  uint16_t* dw = check::ToDevice(w);
  float* dx = check::ToDevice(x);
  float* dy = check::ToDevice(std::vector<float>(kN * kLdy, NAN));
  const Status s = blas.GroupedGemm(dw, kRows, kCols, kGroups, dx, kLdx, kXGroup, kN, dy, kLdy, kYGroup);
  // The last group's inputs end at (groups - 1) * x_group + cols: one short of that is refused.
  const Status refused = blas.GroupedGemm(dw, kRows, kCols, kGroups, dx, (kGroups - 1) * kXGroup + kCols - 1, kXGroup,
                                          kN, dy, kLdy, kYGroup);
  const std::vector<float> y = check::ToHost(dy, kN * kLdy);
  cudaFree(dw), cudaFree(dx), cudaFree(dy);
  if (!s.ok() || refused.code() != StatusCode::kInvalidArgument) {
    std::fprintf(stderr, "GroupedGemm: '%s'; a group past its row: '%s'\n", s.message().c_str(),
                 refused.message().c_str());
    return false;
  }
  for (uint32_t i = 0; i < kN; ++i) {
    for (uint32_t g = 0; g < kGroups; ++g) {
      for (uint32_t r = 0; r < kYGroup; ++r) {
        const float got = y[i * kLdy + g * kYGroup + r];
        if (r >= kRows) {
          if (!std::isnan(got)) return std::fprintf(stderr, "GroupedGemm wrote a gap\n"), false;
          continue;
        }
        double want = 0, magnitude = 0;
        for (uint32_t c = 0; c < kCols; ++c) {
          const double p = Bf(w[(size_t{g} * kRows + r) * kCols + c]) * Bf(x[i * kLdx + g * kXGroup + c]);
          want += p, magnitude += std::abs(p);
        }
        if (!(std::abs(got - want) <= 1e-4 * magnitude)) {
          std::fprintf(stderr, "GroupedGemm input %u group %u row %u: GPU %g, float64 %g\n", i, g, r, got, want);
          return false;
        }
      }
    }
  }
  return true;
}

struct HostMlp {
  std::vector<uint16_t> gate, up, down;
  uint32_t inter;
};

// float64 SwiGLU over bf16 inputs, with the product rounded to bf16 as the
// GPU rounds it before the down projection; adds weight * result to out.
void ReferenceMlp(const HostMlp& m, uint32_t hidden, const float* x, double weight, double* out) {
  std::vector<double> h(m.inter);
  for (uint32_t j = 0; j < m.inter; ++j) {
    double g = 0, u = 0;
    for (uint32_t c = 0; c < hidden; ++c) {
      g += Bf(m.gate[size_t{j} * hidden + c]) * Bf(x[c]);
      u += Bf(m.up[size_t{j} * hidden + c]) * Bf(x[c]);
    }
    h[j] = Bf(static_cast<float>(g / (1.0 + std::exp(-g)) * u));
  }
  for (uint32_t c = 0; c < hidden; ++c) {
    double d = 0;
    for (uint32_t j = 0; j < m.inter; ++j) d += Bf(m.down[size_t{c} * m.inter + j]) * h[j];
    out[c] += weight * d;
  }
}

// Every output within 2e-3 of the largest |want| (the MLPs' bound, above);
// else says which token and value of `width` differ.
bool WithinOfLargest(const char* what, const std::vector<float>& out, const std::vector<double>& want, uint32_t width) {
  double largest = 0;
  for (double v : want) largest = std::max(largest, std::abs(v));
  for (size_t k = 0; k < want.size(); ++k) {
    if (!(std::abs(out[k] - want[k]) <= 2e-3 * largest)) {
      std::fprintf(stderr, "%s token %zu value %zu: GPU %g, float64 %g\n", what, k / width, k % width, out[k], want[k]);
      return false;
    }
  }
  return true;
}

// The gate's choice for input x: float64 logits of the bf16 router and
// input, then SelectExperts, as the CPU backend chooses.
bool ChooseExperts(const std::vector<uint16_t>& router, uint32_t experts, uint32_t hidden, const float* x,
                   const GateParams& gate, std::vector<ExpertChoice>& choices) {
  std::vector<float> logits(experts);
  for (uint32_t e = 0; e < experts; ++e) {
    double l = 0;
    for (uint32_t c = 0; c < hidden; ++c) l += Bf(router[size_t{e} * hidden + c]) * Bf(x[c]);
    logits[e] = static_cast<float>(l);
  }
  return SelectExperts(logits, gate, choices).ok();
}

// The MoE layer against float64, at `tokens` tokens: 33 puts some
// experts' groups over SmallGemmKernel's rows (cuBLAS) and some under; 3
// puts every group under, the shared expert's too.
bool CheckMoe(cuda::Blas& blas, std::mt19937_64& rng, uint32_t tokens) {
  constexpr uint32_t kHidden = 256, kInter = 128, kExperts = 16;
  GateParams gate;
  gate.top_k = 4, gate.group_limited = true, gate.n_group = 4, gate.topk_group = 2;
  gate.routed_scaling_factor = 1.5f;
  std::vector<HostMlp> experts;
  cuda::MoeDeviceWeights dw;
  dw.gate = gate;
  auto make = [&](uint32_t inter) {
    HostMlp m{RandomBf16(size_t{inter} * kHidden, 0.06f, rng), RandomBf16(size_t{inter} * kHidden, 0.06f, rng),
              RandomBf16(size_t{kHidden} * inter, 0.08f, rng), inter};
    cuda::SwiGluDeviceWeights d{check::ToDevice(m.gate), check::ToDevice(m.up), check::ToDevice(m.down), inter};
    return std::pair(m, d);
  };
  for (uint32_t e = 0; e < kExperts; ++e) {
    auto [m, d] = make(kInter);
    experts.push_back(m), dw.experts.push_back(d);
  }
  auto [shared, shared_device] = make(kInter / 2);
  dw.shared = shared_device;
  const std::vector<uint16_t> router = RandomBf16(size_t{kExperts} * kHidden, 0.1f, rng);
  dw.router = check::ToDevice(router);
  const std::vector<float> x = RandomFloats(size_t{tokens} * kHidden, rng);
  float* dx = check::ToDevice(x);
  float* dout = check::ToDevice(std::vector<float>(size_t{tokens} * kHidden, NAN));
  const Status s = blas.MoeForward(dw, kHidden, dx, tokens, dout);
  const std::vector<float> out = check::ToHost(dout, size_t{tokens} * kHidden);
  const auto free_mlp = [](const cuda::SwiGluDeviceWeights& d) {
    for (const uint16_t* p : {d.gate, d.up, d.down}) cudaFree(const_cast<uint16_t*>(p));
  };
  cudaFree(dx), cudaFree(dout), cudaFree(const_cast<uint16_t*>(dw.router));
  free_mlp(dw.shared);
  for (const auto& d : dw.experts) free_mlp(d);
  if (!s.ok()) {
    std::fprintf(stderr, "MoeForward: %s\n", s.message().c_str());
    return false;
  }
  std::vector<double> want(size_t{tokens} * kHidden, 0.0);
  for (uint32_t i = 0; i < tokens; ++i) {
    const float* xi = x.data() + size_t{i} * kHidden;
    std::vector<ExpertChoice> choices;
    if (!ChooseExperts(router, kExperts, kHidden, xi, gate, choices)) return false;
    for (const ExpertChoice& c : choices)
      ReferenceMlp(experts[c.expert], kHidden, xi, c.weight, &want[size_t{i} * kHidden]);
    ReferenceMlp(shared, kHidden, xi, 1.0, &want[size_t{i} * kHidden]);
  }
  return WithinOfLargest("MoE", out, want, kHidden);
}

// A dense layer's MLP (SwiGlu) against float64.
bool CheckDenseMlp(cuda::Blas& blas, std::mt19937_64& rng) {
  constexpr uint32_t kHidden = 192, kInter = 320, kTokens = 9;
  const HostMlp m{RandomBf16(size_t{kInter} * kHidden, 0.07f, rng), RandomBf16(size_t{kInter} * kHidden, 0.07f, rng),
                  RandomBf16(size_t{kHidden} * kInter, 0.06f, rng), kInter};
  const cuda::SwiGluDeviceWeights d{check::ToDevice(m.gate), check::ToDevice(m.up), check::ToDevice(m.down), kInter};
  const std::vector<float> x = RandomFloats(size_t{kTokens} * kHidden, rng);
  float* dx = check::ToDevice(x);
  float* dout = check::ToDevice(std::vector<float>(x.size(), NAN));
  const Status s = blas.SwiGlu(d, kHidden, dx, kTokens, dout);
  const std::vector<float> out = check::ToHost(dout, x.size());
  cudaFree(dx), cudaFree(dout);
  for (const uint16_t* p : {d.gate, d.up, d.down}) cudaFree(const_cast<uint16_t*>(p));
  if (!s.ok()) {
    std::fprintf(stderr, "SwiGlu: %s\n", s.message().c_str());
    return false;
  }
  std::vector<double> want(x.size(), 0.0);
  for (uint32_t i = 0; i < kTokens; ++i)
    ReferenceMlp(m, kHidden, x.data() + size_t{i} * kHidden, 1.0, &want[size_t{i} * kHidden]);
  return WithinOfLargest("dense MLP", out, want, kHidden);
}

void Benchmark(cuda::Blas& blas, std::mt19937_64& rng) {
  constexpr uint32_t kRows = 3072, kCols = 2048;
  const double copy_gbs = cuda::DeviceCopyGBs(size_t{1} << 30);
  uint16_t* w = check::ToDevice(RandomBf16(size_t{kRows} * kCols, 0.02f, rng));
  float* x = check::ToDevice(RandomFloats(size_t{256} * kCols, rng));
  float* y = check::ToDevice(std::vector<float>(size_t{256} * kRows));
  std::printf("\nbf16 projection %u x %u (weights %.1f MB); copy %.0f GB/s\n%6s %10s %12s %10s\n", kRows, kCols,
              kRows * kCols * 2 / 1e6, copy_gbs, "batch", "ms", "weight GB/s", "TFLOP/s");
  for (uint32_t n : {1u, 8u, 32u, 256u}) {
    const double ms = check::Milliseconds([&] { (void)blas.Gemm(w, kRows, kCols, x, n, y); }, 20);
    std::printf("%6u %10.4f %12.0f %10.2f\n", n, ms, kRows * kCols * 2.0 / ms / 1e6,
                2.0 * kRows * kCols * n / ms / 1e9);
  }
  cudaFree(w), cudaFree(x), cudaFree(y);
}

// A DeepSeek-V2-Lite MoE layer (64 experts of 1408, top 6, 2 shared; its
// weights filled with one bf16 value: the time does not depend on them):
// GB/s of the weights read
// (the experts some token chose, and the shared ones) against the copy.
void BenchmarkMoe(cuda::Blas& blas, std::mt19937_64& rng) {
  constexpr uint32_t kHidden = 2048, kInter = 1408, kExperts = 64;
  const double copy_gbs = cuda::DeviceCopyGBs(size_t{1} << 30);
  std::vector<void*> owned;
  auto filled = [&](size_t values) {
    void* p = nullptr;
    if (cudaMalloc(&p, values * 2) != cudaSuccess) return static_cast<uint16_t*>(nullptr);
    cudaMemset(p, 0x3c, values * 2);  // bf16 0x3c3c, about 0.0115
    owned.push_back(p);
    return static_cast<uint16_t*>(p);
  };
  auto mlp = [&](uint32_t inter) {
    return cuda::SwiGluDeviceWeights{filled(size_t{inter} * kHidden), filled(size_t{inter} * kHidden),
                                     filled(size_t{kHidden} * inter), inter};
  };
  cuda::MoeDeviceWeights w;
  w.gate.top_k = 6;
  for (uint32_t e = 0; e < kExperts; ++e) w.experts.push_back(mlp(kInter));
  w.shared = mlp(2 * kInter);
  const std::vector<uint16_t> router = RandomBf16(size_t{kExperts} * kHidden, 0.1f, rng);
  w.router = check::ToDevice(router);
  constexpr uint32_t kMaxTokens = 512;
  const std::vector<float> x = RandomFloats(size_t{kMaxTokens} * kHidden, rng);
  float* dx = check::ToDevice(x);
  float* dout = check::ToDevice(std::vector<float>(x.size()));
  const double expert_bytes = 3.0 * kInter * kHidden * 2;
  std::printf(
      "\nMoE layer, V2-Lite (64 experts of %u, top 6, 2 shared), weights GB/s against copy %.0f GB/s;\n"
      "last column: the same layer with every expert a cuBLAS GEMM a projection (SetSmallGroupTokens(0))\n"
      "%6s %8s %10s %10s %8s %14s\n",
      kInter, copy_gbs, "tokens", "experts", "ms", "GB/s", "% copy", "cuBLAS % copy");
  for (uint32_t n : {1u, 16u, 128u, 512u}) {
    // The experts the gate picks for these tokens (as MoeForward does).
    std::vector<bool> used(kExperts, false);
    for (uint32_t i = 0; i < n; ++i) {
      std::vector<ExpertChoice> choices;
      (void)ChooseExperts(router, kExperts, kHidden, &x[size_t{i} * kHidden], w.gate, choices);
      for (const ExpertChoice& c : choices) used[c.expert] = true;
    }
    const uint32_t touched = static_cast<uint32_t>(std::count(used.begin(), used.end(), true));
    const double bytes = (touched + 2) * expert_bytes;  // the shared pair is one MLP twice as wide
    const double ms = check::Milliseconds([&] { (void)blas.MoeForward(w, kHidden, dx, n, dout); }, 10);
    blas.SetSmallGroupTokens(0);
    const double cublas_ms = check::Milliseconds([&] { (void)blas.MoeForward(w, kHidden, dx, n, dout); }, 10);
    blas.SetSmallGroupTokens(cuda::Blas::kMaxSmallGroupTokens);
    std::printf("%6u %8u %10.3f %10.0f %7.0f%% %13.0f%%\n", n, touched, ms, bytes / ms / 1e6,
                100 * bytes / ms / 1e6 / copy_gbs, 100 * bytes / cublas_ms / 1e6 / copy_gbs);
  }
  for (void* p : owned) cudaFree(p);
  cudaFree(const_cast<uint16_t*>(w.router)), cudaFree(dx), cudaFree(dout);
}

int Main(bool benchmark) {
  if (!check::DeviceOrSkip("the cuBLAS projections and MoE were")) return 77;
  std::unique_ptr<cuda::Blas> blas;
  if (const Status s = cuda::Blas::Create(nullptr, blas); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  std::mt19937_64 rng(std::random_device{}());
  const bool gemm = CheckGemm(*blas, rng), grouped = CheckGroupedGemm(*blas, rng),
             moe = CheckMoe(*blas, rng, 33) && CheckMoe(*blas, rng, 3), dense = CheckDenseMlp(*blas, rng);
  auto verdict = [](bool ok) { return ok ? "matches float64" : "MISMATCH"; };
  std::printf(
      "bf16 GEMM: %s\ngrouped (per-head) GEMM: %s\nMoE (group-limited top-4 of 16 + shared): %s\n"
      "dense SwiGLU MLP: %s\n",
      verdict(gemm), verdict(grouped), verdict(moe), verdict(dense));
  if (benchmark) {
    Benchmark(*blas, rng);
    BenchmarkMoe(*blas, rng);
  }
  return gemm && grouped && moe && dense ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::kernels

int main(int argc, char** argv) { return kvtier::kernels::Main(kvtier::kernels::check::WantBenchmark(argc, argv)); }
