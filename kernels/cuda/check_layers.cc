// GPU RMSNorm and RoPE check, for the device machine (no gtest there): on
// fresh random rows, the CUDA kernels against the CPU's RmsNorm and
// RopeTable::Apply (YaRN, V2-Lite's settings). Tolerances: RMSNorm within
// 1e-5 of each value (relative; the sum of squares is added in another
// order), RoPE within 2e-6 (nvcc fuses a*c - b*s into one FMA); the values
// around the rope dims must come back untouched, bit for bit; the residual
// add must equal the CPU's float sums bit for bit.
// Exit codes: 0 pass, 1 mismatch or CUDA error, 77 no device (ctest: skip).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check_util.h"
#include "kvtier/kernels/cuda_codec.h"
#include "kvtier/kernels/cuda_layers.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/rope.h"

namespace kvtier::kernels {
namespace {

bool CheckRmsNorm(std::mt19937_64& rng) {
  constexpr uint32_t kRows = 37, kDim = 2048;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(size_t{kRows} * kDim), w(kDim);
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = 1.0f + 0.1f * normal(rng);
  float *dx = check::ToDevice(x), *dw = check::ToDevice(w), *dout = check::ToDevice(std::vector<float>(x.size(), NAN));
  const Status s = cuda::RmsNorm(dx, dw, kRows, kDim, 1e-6f, dout, nullptr);
  const std::vector<float> got = check::ToHost(dout, x.size());
  cudaFree(dx), cudaFree(dw), cudaFree(dout);
  if (!s.ok()) {
    std::fprintf(stderr, "cuda::RmsNorm: %s\n", s.message().c_str());
    return false;
  }
  std::vector<float> want(kDim);
  for (uint32_t r = 0; r < kRows; ++r) {
    (void)RmsNorm(std::span(x).subspan(size_t{r} * kDim, kDim), w, 1e-6f, want);
    for (uint32_t c = 0; c < kDim; ++c) {
      const float g = got[size_t{r} * kDim + c];
      if (!(std::abs(g - want[c]) <= 1e-5f * std::max(1.0f, std::abs(want[c])))) {
        std::fprintf(stderr, "RmsNorm row %u col %u: GPU %g, CPU %g\n", r, c, g, want[c]);
        return false;
      }
    }
  }
  return true;
}

// q as the model lays it out: per token, heads of 128 nope + 64 rope values.
bool CheckRope(std::mt19937_64& rng) {
  constexpr uint32_t kRows = 50, kHeads = 16, kNope = 128, kRopeDim = 64, kHead = kNope + kRopeDim;
  YarnParams yarn;
  yarn.factor = 40, yarn.original_max_position_embeddings = 4096, yarn.mscale = 0.707, yarn.mscale_all_dim = 0.707;
  RopeTable table;
  if (!RopeTable::Create(kRopeDim, 10000.0, &yarn, table).ok()) return false;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int64_t> position(0, 163840);
  std::vector<float> x(size_t{kRows} * kHeads * kHead);
  for (float& v : x) v = normal(rng);
  std::vector<int64_t> positions(kRows);
  for (int64_t& p : positions) p = position(rng);
  float* dx = check::ToDevice(x);
  int64_t* dpos = check::ToDevice(positions);
  const Status s = cuda::ApplyRope(table, dpos, dx + kNope, kRows, kHeads, size_t{kHeads} * kHead, kHead, nullptr);
  const std::vector<float> got = check::ToHost(dx, x.size());
  cudaFree(dx), cudaFree(dpos);
  if (!s.ok()) {
    std::fprintf(stderr, "cuda::ApplyRope: %s\n", s.message().c_str());
    return false;
  }
  std::vector<float> want = x;
  for (uint32_t r = 0; r < kRows; ++r) {
    for (uint32_t h = 0; h < kHeads; ++h) {
      table.Apply(positions[r], std::span(want).subspan((size_t{r} * kHeads + h) * kHead + kNope, kRopeDim));
    }
  }
  for (size_t i = 0; i < x.size(); ++i) {
    const bool rope = i % kHead >= kNope;
    const bool same = rope ? std::abs(got[i] - want[i]) <= 2e-6f * std::max(1.0f, std::abs(want[i]))
                           : std::memcmp(&got[i], &want[i], 4) == 0;
    if (!same) {
      std::fprintf(stderr, "RoPE element %zu (%s): GPU %g, CPU %g\n", i, rope ? "rope" : "untouched", got[i], want[i]);
      return false;
    }
  }
  return true;
}

// The residual add: float sums, bit for bit the CPU's.
bool CheckAdd(std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(100003), y(x.size());
  for (float& v : x) v = normal(rng);
  for (float& v : y) v = normal(rng);
  float *dx = check::ToDevice(x), *dy = check::ToDevice(y);
  const Status s = cuda::AddInPlace(dx, dy, x.size(), nullptr);
  const std::vector<float> got = check::ToHost(dx, x.size());
  cudaFree(dx), cudaFree(dy);
  for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  return s.ok() && std::memcmp(got.data(), x.data(), x.size() * 4) == 0;
}

int Main() {
  if (!check::DeviceOrSkip("RMSNorm and RoPE were")) return 77;
  std::mt19937_64 rng(std::random_device{}());
  const bool norm = CheckRmsNorm(rng), rope = CheckRope(rng), add = CheckAdd(rng);
  std::printf("RMSNorm: %s\nRoPE (YaRN): %s\nresidual add: %s\n", norm ? "matches the CPU" : "MISMATCH",
              rope ? "matches the CPU" : "MISMATCH", add ? "matches the CPU bit for bit" : "MISMATCH");
  return norm && rope && add ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::kernels

int main() { return kvtier::kernels::Main(); }
