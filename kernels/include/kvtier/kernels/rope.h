// Rotary position embedding as DeepSeek-V2 applies it to q_pe and k_pe:
// the input's interleaved pairs (x0, x1), (x2, x3), ... are first
// de-interleaved to [x0, x2, ..., x1, x3, ...] (DeepSeek's
// view(d/2, 2).transpose), then rotated with rotate_half. Frequencies follow
// DeepseekV2RotaryEmbedding, or DeepseekV2YarnRotaryEmbedding when YaRN
// scaling is configured (blended frequencies and the cos/sin mscale).
// The output stays de-interleaved; q and k use the same order, so their dot
// products are those of the reference model.
#ifndef KVTIER_KERNELS_ROPE_H_
#define KVTIER_KERNELS_ROPE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/kernels/status.h"

namespace kvtier::kernels {

// The rope_scaling fields of a YaRN config.json.
struct YarnParams {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

// Precomputed frequencies for one head dimension. Immutable; thread-safe.
class RopeTable {
 public:
  // dim: rotary dims (even, >= 2); base: rope_theta; yarn: null for plain RoPE.
  static Status Create(uint32_t dim, double base, const YarnParams* yarn, RopeTable& out);

  uint32_t dim() const { return dim_; }
  // Angle frequency of pair i (0 <= i < dim/2) and the cos/sin multiplier.
  const std::vector<double>& inv_freq() const { return inv_freq_; }
  double mscale() const { return mscale_; }

  // Rotates `x` (dim values, interleaved pairs) in place for `position`.
  void Apply(int64_t position, std::span<float> x) const;
  // Rotates `x` (dim values already in halves: [x_0..x_{d/2-1} | the rest],
  // as DeepSeek-V3.2's indexer lays out its rope part) in place with
  // rotate_half, no de-interleaving first.
  void ApplyHalves(int64_t position, std::span<float> x) const;
  // Rotates `x` (dim values) in place as DeepSeek-V4 does: each adjacent
  // pair (x_2i, x_2i+1) as a complex number times e^(i angle), kept in
  // place; `inverse` rotates by -angle (V4 un-rotates attention outputs).
  void ApplyPairs(int64_t position, std::span<float> x, bool inverse = false) const;

 private:
  uint32_t dim_ = 0;
  std::vector<double> inv_freq_;
  double mscale_ = 1.0;
};

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_ROPE_H_
