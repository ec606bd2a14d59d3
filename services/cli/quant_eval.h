// quant-eval: measures how much each quantization scheme distorts MLA
// latents, side by side on the same data, the way the seed reports compare
// them. The four kvtier codecs run through kernels/; the other schemes are
// reference baselines that exist only for this comparison.
#ifndef KVTIER_SERVICES_CLI_QUANT_EVAL_H_
#define KVTIER_SERVICES_CLI_QUANT_EVAL_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/kernels/codec.h"

namespace kvtier::cli {

// Rows of `latent_dim + rope_dim` floats, rope dims last.
struct LatentRows {
  std::vector<float> values;
  uint32_t latent_dim = 0;
  uint32_t rope_dim = 0;

  uint32_t dim() const { return latent_dim + rope_dim; }
  size_t tokens() const { return dim() == 0 ? 0 : values.size() / dim(); }
};

// Latents shaped like DeepSeek-V2's after kv_a_layernorm: channels with their
// own scale and offset, about 2% of them outliers tens of times larger, and
// k_pe pairs rotating with position. Deterministic for a seed.
LatentRows MakeSyntheticLatents(uint32_t tokens, uint32_t latent_dim, uint32_t rope_dim, uint64_t seed);

struct SchemeResult {
  std::string scheme;                   // e.g. "int8 per-channel"
  std::optional<kernels::Codec> codec;  // set for kvtier's own codecs
  double bytes_per_token = 0;           // per layer, scales included
  double latent_rel_error = 0;          // mean over tokens of ||x - x'|| / ||x||
  double rope_rel_error = 0;
};

// One kvtier codec over `rows` in blocks of `tokens_per_block` (a last,
// partial block is encoded at its own size).
absl::StatusOr<SchemeResult> EvaluateCodec(kernels::Codec codec, const LatentRows& rows, uint32_t tokens_per_block);

// The seeds' comparison: per-tensor, per-token and per-channel int8,
// symmetric and asymmetric int4 (per channel and per token-group), fp8 and
// bf16, in that order of the table.
absl::StatusOr<std::vector<SchemeResult>> EvaluateAllSchemes(const LatentRows& rows, uint32_t tokens_per_block);

}  // namespace kvtier::cli

#endif  // KVTIER_SERVICES_CLI_QUANT_EVAL_H_
