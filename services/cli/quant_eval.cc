#include "services/cli/quant_eval.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numbers>
#include <random>

#include "absl/strings/str_cat.h"
#include "kvtier/kernels/float_formats.h"
#include "services/base/status.h"

namespace kvtier::cli {
namespace {

using kernels::Bf16ToFloat;
using kernels::FloatToBf16TowardNegative;
using kernels::FloatToBf16TowardPositive;

// Mean over tokens of ||x - x'|| / ||x|| over channels [begin, end).
double MeanRelativeError(const LatentRows& x, std::span<const float> recon, uint32_t begin, uint32_t end) {
  if (begin == end || x.tokens() == 0) return 0.0;
  double sum = 0.0;
  for (size_t t = 0; t < x.tokens(); ++t) {
    double err2 = 0.0, norm2 = 0.0;
    for (uint32_t c = begin; c < end; ++c) {
      const double v = x.values[t * x.dim() + c];
      const double d = v - recon[t * x.dim() + c];
      err2 += d * d;
      norm2 += v * v;
    }
    sum += norm2 > 0 ? std::sqrt(err2 / norm2) : (err2 > 0 ? 1.0 : 0.0);
  }
  return sum / static_cast<double>(x.tokens());
}

SchemeResult Finish(std::string name, std::optional<kernels::Codec> codec, size_t bytes, const LatentRows& rows,
                    std::span<const float> recon) {
  SchemeResult r;
  r.scheme = std::move(name);
  r.codec = codec;
  r.bytes_per_token = static_cast<double>(bytes) / static_cast<double>(rows.tokens());
  r.latent_rel_error = MeanRelativeError(rows, recon, 0, rows.latent_dim);
  r.rope_rel_error = MeanRelativeError(rows, recon, rows.latent_dim, rows.dim());
  return r;
}

// ---- Baselines: quantize then reconstruct in place, return stored bytes. ----

// A rectangle of a block: rows [t0, t1) x channels [c0, c1), row stride dim.
struct Region {
  float* base;
  uint32_t dim, t0, t1, c0, c1;
  template <typename F>
  void ForEach(F&& f) const {
    for (uint32_t t = t0; t < t1; ++t)
      for (uint32_t c = c0; c < c1; ++c) f(base[size_t{t} * dim + c]);
  }
};

// Symmetric: one f32-exact scale amax / levels for the whole region.
void QuantizeSymmetric(const Region& r, float levels, bool bf16_scale) {
  float amax = 0.0f;
  r.ForEach([&](float& v) { amax = std::max(amax, std::fabs(v)); });
  float s = amax / levels;
  if (bf16_scale) s = Bf16ToFloat(FloatToBf16TowardPositive(s));
  if (s == 0.0f) return;
  r.ForEach([&](float& v) { v = std::clamp(std::nearbyint(v / s), -levels, levels) * s; });
}

// Asymmetric: bf16 zero (min, rounded down) and bf16 scale over the region.
void QuantizeAsymmetric(const Region& r, float levels) {
  float lo = INFINITY, hi = -INFINITY;
  r.ForEach([&](float& v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  });
  const float z = Bf16ToFloat(FloatToBf16TowardNegative(lo));
  const float s = Bf16ToFloat(FloatToBf16TowardPositive((hi - z) / levels));
  if (s == 0.0f) {
    r.ForEach([&](float& v) { v = z; });
    return;
  }
  r.ForEach([&](float& v) { v = z + std::clamp(std::nearbyint((v - z) / s), 0.0f, levels) * s; });
}

// Calls f(region) for the latent part and the rope part (if any) of a block.
void ForEachPart(float* block, uint32_t tokens, const LatentRows& rows, const std::function<void(const Region&)>& f) {
  f(Region{block, rows.dim(), 0, tokens, 0, rows.latent_dim});
  if (rows.rope_dim > 0) f(Region{block, rows.dim(), 0, tokens, rows.latent_dim, rows.dim()});
}

using Baseline = std::function<size_t(float* block, uint32_t tokens, const LatentRows& rows)>;

size_t Int8PerTensor(float* block, uint32_t tokens, const LatentRows& rows) {
  ForEachPart(block, tokens, rows, [](const Region& r) { QuantizeSymmetric(r, 127, false); });
  return size_t{tokens} * rows.dim() + 4 * (rows.rope_dim > 0 ? 2 : 1);
}

size_t Int8PerToken(float* block, uint32_t tokens, const LatentRows& rows) {
  for (uint32_t t = 0; t < tokens; ++t) {
    ForEachPart(block, tokens, rows, [&](const Region& r) {
      QuantizeSymmetric(Region{r.base, r.dim, t, t + 1, r.c0, r.c1}, 127, false);
    });
  }
  return size_t{tokens} * (rows.dim() + 4 * (rows.rope_dim > 0 ? 2 : 1));
}

size_t Int4SymmetricPerChannel(float* block, uint32_t tokens, const LatentRows& rows) {
  for (uint32_t c = 0; c < rows.dim(); ++c) {
    QuantizeSymmetric(Region{block, rows.dim(), 0, tokens, c, c + 1}, 7, true);
  }
  return size_t{tokens} * ((rows.dim() + 1) / 2) + 2 * size_t{rows.dim()};
}

constexpr uint32_t kTokenGroup = 64;

size_t Int4PerTokenGroup(float* block, uint32_t tokens, const LatentRows& rows) {
  size_t groups = 0;
  ForEachPart(block, tokens, rows, [&](const Region& part) {
    for (uint32_t c0 = part.c0; c0 < part.c1; c0 += kTokenGroup) {
      const uint32_t c1 = std::min(c0 + kTokenGroup, part.c1);
      ++groups;
      for (uint32_t t = 0; t < tokens; ++t) {
        QuantizeAsymmetric(Region{block, rows.dim(), t, t + 1, c0, c1}, 15);
      }
    }
  });
  return size_t{tokens} * ((rows.dim() + 1) / 2 + 4 * groups);
}

SchemeResult RunBaseline(std::string name, const Baseline& baseline, const LatentRows& rows,
                         uint32_t tokens_per_block) {
  std::vector<float> recon = rows.values;
  size_t bytes = 0;
  for (size_t t0 = 0; t0 < rows.tokens(); t0 += tokens_per_block) {
    const uint32_t n = static_cast<uint32_t>(std::min<size_t>(tokens_per_block, rows.tokens() - t0));
    bytes += baseline(recon.data() + t0 * rows.dim(), n, rows);
  }
  return Finish(std::move(name), std::nullopt, bytes, rows, recon);
}

}  // namespace

LatentRows MakeSyntheticLatents(uint32_t tokens, uint32_t latent_dim, uint32_t rope_dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  LatentRows rows;
  rows.latent_dim = latent_dim;
  rows.rope_dim = rope_dim;
  rows.values.resize(size_t{tokens} * rows.dim());

  // Per channel: a scale (log-normal, like a trained layernorm weight), an
  // offset, and for ~2% of channels an outlier factor of 20-60x.
  std::vector<float> scale(latent_dim), offset(latent_dim);
  for (uint32_t c = 0; c < latent_dim; ++c) {
    scale[c] = 0.5f * std::exp(0.5f * normal(rng));
    if (uniform(rng) < 0.02f) scale[c] *= 20.0f + 40.0f * uniform(rng);
    offset[c] = 0.8f * scale[c] * normal(rng);
  }
  // k_pe: pairs (i, i + rope_dim/2) rotating at DeepSeek's frequencies.
  const uint32_t pairs = rope_dim / 2;
  std::vector<float> radius(pairs), phase(pairs), freq(pairs);
  for (uint32_t p = 0; p < pairs; ++p) {
    radius[p] = std::exp(0.5f * normal(rng));
    phase[p] = 2.0f * std::numbers::pi_v<float> * uniform(rng);
    freq[p] = std::pow(10000.0f, -2.0f * static_cast<float>(p) / static_cast<float>(rope_dim));
  }
  for (uint32_t t = 0; t < tokens; ++t) {
    float* row = rows.values.data() + size_t{t} * rows.dim();
    for (uint32_t c = 0; c < latent_dim; ++c) row[c] = offset[c] + scale[c] * normal(rng);
    for (uint32_t p = 0; p < pairs; ++p) {
      const float r = radius[p] * (1.0f + 0.2f * normal(rng));
      const float angle = phase[p] + freq[p] * static_cast<float>(t);
      row[latent_dim + p] = r * std::cos(angle);
      row[latent_dim + pairs + p] = r * std::sin(angle);
    }
    if (rope_dim % 2 == 1) row[rows.dim() - 1] = normal(rng);
  }
  return rows;
}

absl::StatusOr<SchemeResult> EvaluateCodec(kernels::Codec codec, const LatentRows& rows, uint32_t tokens_per_block) {
  if (rows.tokens() == 0) return absl::InvalidArgumentError("no tokens to evaluate");
  if (tokens_per_block < 1 || tokens_per_block > kernels::kMaxBlockTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens per block ", tokens_per_block, " outside 1..", kernels::kMaxBlockTokens));
  }
  std::vector<float> recon(rows.values.size());
  std::vector<uint8_t> encoded;
  size_t bytes = 0;
  for (size_t t0 = 0; t0 < rows.tokens(); t0 += tokens_per_block) {
    const uint32_t n = static_cast<uint32_t>(std::min<size_t>(tokens_per_block, rows.tokens() - t0));
    const kernels::BlockShape shape{n, rows.latent_dim, rows.rope_dim};
    const std::span<const float> in(rows.values.data() + t0 * rows.dim(), shape.values());
    encoded.resize(kernels::EncodedBytes(codec, shape));
    KVTIER_RETURN_IF_ERROR(FromKernelStatus(kernels::Quantize(codec, shape, in, encoded)));
    KVTIER_RETURN_IF_ERROR(FromKernelStatus(
        kernels::Dequantize(codec, shape, encoded, std::span<float>(recon.data() + t0 * rows.dim(), shape.values()))));
    bytes += encoded.size();
  }
  return Finish(std::string(kernels::CodecName(codec)), codec, bytes, rows, recon);
}

absl::StatusOr<std::vector<SchemeResult>> EvaluateAllSchemes(const LatentRows& rows, uint32_t tokens_per_block) {
  std::vector<SchemeResult> table;
  auto add_codec = [&](kernels::Codec codec, std::string name) -> absl::Status {
    KVTIER_ASSIGN_OR_RETURN(SchemeResult r, EvaluateCodec(codec, rows, tokens_per_block));
    r.scheme = std::move(name);
    table.push_back(std::move(r));
    return absl::OkStatus();
  };
  KVTIER_RETURN_IF_ERROR(add_codec(kernels::Codec::kBf16, "bf16 (kvtier bf16)"));
  KVTIER_RETURN_IF_ERROR(add_codec(kernels::Codec::kFp8, "fp8 e4m3 tile-128 (kvtier fp8)"));
  table.push_back(RunBaseline("int8 per-tensor", Int8PerTensor, rows, tokens_per_block));
  table.push_back(RunBaseline("int8 per-token", Int8PerToken, rows, tokens_per_block));
  KVTIER_RETURN_IF_ERROR(add_codec(kernels::Codec::kInt8, "int8 per-channel (kvtier int8)"));
  table.push_back(RunBaseline("int4 symmetric per-channel", Int4SymmetricPerChannel, rows, tokens_per_block));
  table.push_back(RunBaseline("int4 asymmetric per-token group-64", Int4PerTokenGroup, rows, tokens_per_block));
  KVTIER_RETURN_IF_ERROR(add_codec(kernels::Codec::kInt4, "int4 asymmetric per-channel (kvtier int4)"));
  return table;
}

}  // namespace kvtier::cli
