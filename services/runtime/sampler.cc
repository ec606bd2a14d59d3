#include "services/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include "kvtier/kernels/parallel.h"

namespace kvtier::runtime {
namespace {

// SplitMix64: a well-mixed 64-bit value from (seed, step).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The largest logit, in four running maxima (one chain of dependent
// comparisons took 3.5 ns an entry).
float MaxOf(std::span<const float> v) {
  float m[4] = {v[0], v[0], v[0], v[0]};
  size_t i = 0;
  for (; i + 4 <= v.size(); i += 4) {
    for (size_t j = 0; j < 4; ++j) m[j] = std::max(m[j], v[i + j]);
  }
  for (; i < v.size(); ++i) m[0] = std::max(m[0], v[i]);
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

// Sum of f(t) over t in [0, n) in double, four sums apart so that the
// additions do not wait on each other (these passes run for every token).
template <typename F>
double SumOver(size_t n, F f) {
  double sums[4] = {0, 0, 0, 0};
  for (size_t t = 0; t < n; ++t) sums[t % 4] += f(static_cast<uint32_t>(t));
  return (sums[0] + sums[1]) + (sums[2] + sums[3]);
}

// 0, 1, ..., n - 1, kept per thread and grown as needed (what the sort
// and the draws go over; views::iota would do, but clang 14, which
// scripts/fuzz.sh builds with, cannot compile gcc 12's).
std::span<const uint32_t> TokenIds(size_t n) {
  thread_local std::vector<uint32_t> ids;
  if (ids.size() < n) {
    const size_t had = ids.size();
    ids.resize(n);
    std::iota(ids.begin() + static_cast<std::ptrdiff_t>(had), ids.end(), static_cast<uint32_t>(had));
  }
  return std::span(ids).first(n);
}

// LogSumExp given the logits' maximum: float exps, summed in double.
double LogSumExpWithMax(std::span<const float> logits, float max) {
  return std::log(SumOver(logits.size(), [&](uint32_t t) { return double{std::exp(logits[t] - max)}; })) + max;
}

}  // namespace

absl::Status ValidateSampling(const Sampling& s) {
  if (!std::isfinite(s.temperature) || s.temperature < 0 || s.temperature > 100) {
    return absl::InvalidArgumentError("temperature must be in [0, 100]");
  }
  if (!(s.top_p > 0) || s.top_p > 1) return absl::InvalidArgumentError("top_p must be in (0, 1]");
  return absl::OkStatus();
}

double LogSumExp(std::span<const float> logits) { return LogSumExpWithMax(logits, MaxOf(logits)); }

Sampled Sample(std::span<const float> logits, const Sampling& s, uint64_t step, size_t top_n) {
  const size_t n = logits.size();
  const float max = MaxOf(logits);
  const double log_sum = LogSumExpWithMax(logits, max);
  // Tokens most likely first, ties by id, but only as many as are needed
  // (the top logprobs, the nucleus): sorting a real vocabulary whole for
  // every token costs milliseconds (load/sampler_bench).
  const auto before = [&](uint32_t a, uint32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const std::span<const uint32_t> ids = TokenIds(n);
  Sampled out;
  std::vector<uint32_t> top(std::min(top_n, n));
  std::partial_sort_copy(ids.begin(), ids.end(), top.begin(), top.end(), before);
  for (uint32_t t : top) out.top.push_back({t, static_cast<float>(logits[t] - log_sum)});
  out.token = static_cast<uint32_t>(std::find(logits.begin(), logits.end(), max) - logits.begin());  // first of ties
  if (out.token >= n) out.token = 0;  // a NaN maximum matches nothing; still a token of the vocabulary
  if (s.temperature > 0) {
    // Each token's weight under the temperature, computed once for the
    // total, the nucleus and the draw; kept per thread between calls (a
    // fresh vocabulary-sized buffer faults its pages in for every token).
    const float inv_temperature = 1.0f / s.temperature;
    thread_local std::vector<float> weights;
    weights.resize(n);
    const double total =
        SumOver(n, [&](uint32_t t) { return double{weights[t] = std::exp((logits[t] - max) * inv_temperature)}; });
    const auto weight = [&](uint32_t t) { return double{weights[t]}; };
    const double u01 = static_cast<double>(Mix(s.seed ^ Mix(step)) >> 11) * 0x1p-53;
    // Draws from `candidates` (in their order) in proportion to weight.
    const auto draw = [&](const auto& candidates, double mass) {
      const double u = u01 * mass;
      double acc = 0;
      uint32_t last = 0;
      for (uint32_t t : candidates) {
        acc += weight(t);
        last = t;
        if (u < acc) return t;
      }
      return last;
    };
    if (s.top_p >= 1) {
      out.token = draw(ids, total);
    } else {
      // The most likely tokens whose mass first reaches top_p, sorting
      // more of them only while it has not.
      std::vector<uint32_t> order(ids.begin(), ids.end());
      size_t sorted = 0, keep = 0;
      double kept = 0;
      for (size_t k = 64; keep == 0; k *= 2) {
        const size_t from = sorted;
        sorted = std::min(k, n);
        std::partial_sort(order.begin() + static_cast<std::ptrdiff_t>(from),
                          order.begin() + static_cast<std::ptrdiff_t>(sorted), order.end(), before);
        for (size_t i = from; i < sorted && keep == 0; ++i) {
          kept += weight(order[i]);
          if (kept / total >= s.top_p) keep = i + 1;
        }
        if (sorted == n && keep == 0) keep = n;
      }
      out.token = draw(std::span(order).first(keep), kept);
    }
  }
  out.logprob = static_cast<float>(logits[out.token] - log_sum);
  return out;
}

std::vector<Sampled> SampleEach(std::span<const SampleRequest> requests) {
  std::vector<Sampled> out(requests.size());
  kernels::ParallelFor(requests.size(), 1, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const SampleRequest& r = requests[i];
      out[i] = Sample(r.logits, *r.sampling, r.step, r.top_n);
    }
  });
  return out;
}

}  // namespace kvtier::runtime
