#include "services/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvtier::runtime {
namespace {

// SplitMix64: a well-mixed 64-bit value from (seed, step).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

absl::Status ValidateSampling(const Sampling& s) {
  if (!std::isfinite(s.temperature) || s.temperature < 0 || s.temperature > 100) {
    return absl::InvalidArgumentError("temperature must be in [0, 100]");
  }
  if (!(s.top_p > 0) || s.top_p > 1) return absl::InvalidArgumentError("top_p must be in (0, 1]");
  return absl::OkStatus();
}

Sampled Sample(std::span<const float> logits, const Sampling& s, uint64_t step, size_t top_n) {
  const size_t n = logits.size();
  const double max = *std::max_element(logits.begin(), logits.end());
  double log_sum = 0;
  for (float l : logits) log_sum += std::exp(l - max);
  log_sum = std::log(log_sum) + max;
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return logits[a] > logits[b]; });
  Sampled out;
  for (size_t i = 0; i < std::min(top_n, n); ++i) {
    out.top.push_back({order[i], static_cast<float>(logits[order[i]] - log_sum)});
  }
  out.token = order[0];
  if (s.temperature > 0) {
    // Probabilities under the temperature, most likely first; keep the
    // smallest prefix whose mass reaches top_p; draw from it.
    std::vector<double> p(n);
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += (p[i] = std::exp((logits[order[i]] - max) / s.temperature));
    size_t keep = n;
    double mass = 0;
    for (size_t i = 0; i < n; ++i) {
      mass += p[i] / total;
      if (mass >= s.top_p) {
        keep = i + 1;
        break;
      }
    }
    double kept = 0;
    for (size_t i = 0; i < keep; ++i) kept += p[i];
    const double u = static_cast<double>(Mix(s.seed ^ Mix(step)) >> 11) * 0x1p-53 * kept;
    double acc = 0;
    out.token = order[keep - 1];
    for (size_t i = 0; i < keep; ++i) {
      acc += p[i];
      if (u < acc) {
        out.token = order[i];
        break;
      }
    }
  }
  out.logprob = static_cast<float>(logits[out.token] - log_sum);
  return out;
}

}  // namespace kvtier::runtime
