#include "kvtier/kernels/indexer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/parallel.h"
#include "mla_attention_float.h"
#include "scratch.h"

namespace kvtier::kernels {

Status HadamardRotate(std::span<float> x) {
  const size_t n = x.size();
  if (n == 0 || (n & (n - 1)) != 0) {
    return InvalidArgument("HadamardRotate: " + std::to_string(n) + " values, not a power of two");
  }
  for (size_t span = 1; span < n; span *= 2) {
    for (size_t start = 0; start < n; start += 2 * span) {
      for (size_t i = start; i < start + span; ++i) {
        const float a = x[i], b = x[i + span];
        x[i] = a + b;
        x[i + span] = a - b;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (float& v : x) v *= scale;
  return OkStatus();
}

Status QuantizeIndexerFp8(std::span<const float> x, size_t group, std::span<uint8_t> codes, std::span<float> scales) {
  if (group == 0 || x.size() % group != 0 || codes.size() != x.size() || scales.size() != x.size() / group) {
    return InvalidArgument("QuantizeIndexerFp8: values, codes and scales do not fit groups of " +
                           std::to_string(group));
  }
  for (size_t g = 0; g < scales.size(); ++g) {
    const std::span<const float> values = x.subspan(g * group, group);
    float amax = 1e-4f;
    for (float v : values) {
      if (!std::isfinite(v)) return InvalidArgument("QuantizeIndexerFp8: a value is not finite");
      amax = std::max(amax, std::fabs(v));
    }
    const float scale = PowerOfTwoAtLeast(amax / kFp8E4m3Max);
    scales[g] = scale;
    for (size_t i = 0; i < group; ++i) codes[g * group + i] = FloatToFp8E4m3(values[i] / scale);
  }
  return OkStatus();
}

Status IndexerScores(uint32_t heads, uint32_t head_dim, std::span<const uint8_t> q_codes,
                     std::span<const float> weights, std::span<const uint8_t> key_codes,
                     std::span<const float> key_scales, std::span<float> scores) {
  const size_t tokens = scores.size();
  if (q_codes.size() != size_t{heads} * head_dim || weights.size() != heads || key_codes.size() != tokens * head_dim ||
      key_scales.size() != tokens) {
    return InvalidArgument("IndexerScores: query, weights, keys and scores do not fit " + std::to_string(heads) +
                           " heads of " + std::to_string(head_dim));
  }
  static const std::array<float, 256> kE4m3 = [] {
    std::array<float, 256> values{};
    for (int c = 0; c < 256; ++c) values[c] = Fp8E4m3ToFloat(static_cast<uint8_t>(c));
    return values;
  }();
  std::vector<float> q(q_codes.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = kE4m3[q_codes[i]];
  // Keys a tile at a time, widened to float, then every head's dot products
  // for the tile as one Gemm (its wide kernels, not a serial sum).
  constexpr size_t kTile = 32;
  ParallelFor(tokens, 8 * kTile, [&](size_t begin, size_t end) {
    std::vector<float> keys(kTile * head_dim), dots(kTile * heads);
    for (size_t first = begin; first < end; first += kTile) {
      const size_t n = std::min(kTile, end - first);
      const uint8_t* codes = key_codes.data() + first * head_dim;
      for (size_t i = 0; i < n * head_dim; ++i) keys[i] = kE4m3[codes[i]];
      Gemm(q.data(), heads, head_dim, keys.data(), n, head_dim, dots.data(), heads);
      for (size_t t = 0; t < n; ++t) {
        float sum = 0.0f;
        for (uint32_t h = 0; h < heads; ++h) sum += weights[h] * std::max(dots[t * heads + h], 0.0f);
        scores[first + t] = key_scales[first + t] * sum;
      }
    }
  });
  return OkStatus();
}

void V4IndexerScores(uint32_t heads, uint32_t dim, const float* q, const float* weights, const float* keys,
                     size_t count, float* scores) {
  // A chunk of keys at a time: its dots with every head stay in cache, and
  // the buffer (kept per thread) does not grow with the context.
  constexpr size_t kChunk = 256;
  thread_local std::vector<float> chunk_dots;
  float* dots = cpu::Sized(chunk_dots, size_t{heads} * std::min(kChunk, count));
  for (size_t g0 = 0; g0 < count; g0 += kChunk) {
    const size_t n = std::min(kChunk, count - g0);
    cpu::RowScores(keys + g0 * dim, n, dim, heads, q, dots);
    float* s = scores + g0;
    std::fill_n(s, n, 0.0f);
    for (uint32_t h = 0; h < heads; ++h) {
      for (size_t g = 0; g < n; ++g) s[g] += std::max(dots[h * n + g], 0.0f) * weights[h];
    }
  }
}

void SelectTopTokens(std::span<const float> scores, size_t k, std::vector<uint32_t>& out) {
  out.resize(scores.size());
  std::iota(out.begin(), out.end(), 0u);
  const size_t keep = std::min(k, scores.size());
  std::partial_sort(out.begin(), out.begin() + static_cast<ptrdiff_t>(keep), out.end(),
                    [&](uint32_t a, uint32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); });
  out.resize(keep);
}

}  // namespace kvtier::kernels
