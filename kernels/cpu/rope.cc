#include "kvtier/kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace kvtier::kernels {
namespace {

// DeepSeek-V2's yarn_* helpers, in double.
double CorrectionDim(double rotations, double dim, double base, double max_pos) {
  return dim * std::log(max_pos / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

double YarnMscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

}  // namespace

Status RopeTable::Create(uint32_t dim, double base, const YarnParams* yarn, RopeTable& out) {
  if (dim < 2 || dim % 2 != 0) {
    return InvalidArgument("rope dim " + std::to_string(dim) + " must be even and >= 2");
  }
  if (!(base > 1.0) || !std::isfinite(base)) return InvalidArgument("rope_theta must be > 1");
  RopeTable t;
  t.dim_ = dim;
  const uint32_t half = dim / 2;
  t.inv_freq_.resize(half);
  for (uint32_t i = 0; i < half; ++i) {
    t.inv_freq_[i] = 1.0 / std::pow(base, 2.0 * i / dim);  // freq_extra
  }
  if (yarn != nullptr) {
    if (!(yarn->factor > 0) || !(yarn->original_max_position_embeddings > 0)) {
      return InvalidArgument("yarn factor and original_max_position_embeddings must be positive");
    }
    const double max_pos = static_cast<double>(yarn->original_max_position_embeddings);
    const double low = std::max(std::floor(CorrectionDim(yarn->beta_fast, dim, base, max_pos)), 0.0);
    double high = std::min(std::ceil(CorrectionDim(yarn->beta_slow, dim, base, max_pos)), dim - 1.0);
    if (low == high) high += 0.001;
    for (uint32_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double extrapolate = 1.0 - ramp;  // inv_freq_mask
      const double interpolated = t.inv_freq_[i] / yarn->factor;
      t.inv_freq_[i] = interpolated * (1.0 - extrapolate) + t.inv_freq_[i] * extrapolate;
    }
    t.mscale_ = YarnMscale(yarn->factor, yarn->mscale) / YarnMscale(yarn->factor, yarn->mscale_all_dim);
  }
  out = std::move(t);
  return OkStatus();
}

void RopeTable::Apply(int64_t position, std::span<float> x) const {
  const uint32_t half = dim_ / 2;
  float y[1024];  // de-interleaved copy; rope dims are small (64 in DeepSeek)
  std::vector<float> big;
  float* d = y;
  if (dim_ > 1024) {
    big.resize(dim_);
    d = big.data();
  }
  for (uint32_t i = 0; i < half; ++i) {
    d[i] = x[2 * i];
    d[half + i] = x[2 * i + 1];
  }
  std::copy_n(d, dim_, x.begin());
  ApplyHalves(position, x);
}

void RopeTable::ApplyHalves(int64_t position, std::span<float> x) const {
  const uint32_t half = dim_ / 2;
  for (uint32_t i = 0; i < half; ++i) {
    const float first = x[i], second = x[half + i];
    const double angle = static_cast<double>(position) * inv_freq_[i];
    const float c = static_cast<float>(std::cos(angle) * mscale_);
    const float s = static_cast<float>(std::sin(angle) * mscale_);
    x[i] = first * c - second * s;         // rotate_half: -x2 in the first half
    x[half + i] = second * c + first * s;  // x1 in the second
  }
}

void RopeTable::ApplyPairs(int64_t position, std::span<float> x, bool inverse) const {
  for (uint32_t i = 0; i < dim_ / 2; ++i) {
    const double angle = static_cast<double>(position) * inv_freq_[i];
    const float c = static_cast<float>(std::cos(angle) * mscale_);
    const float s = static_cast<float>((inverse ? -std::sin(angle) : std::sin(angle)) * mscale_);
    const float re = x[2 * i], im = x[2 * i + 1];
    x[2 * i] = re * c - im * s;
    x[2 * i + 1] = re * s + im * c;
  }
}

}  // namespace kvtier::kernels
