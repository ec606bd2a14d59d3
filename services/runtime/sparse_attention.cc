#include "services/runtime/sparse_attention.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/indexer.h"
#include "services/base/status.h"

namespace kvtier::runtime {
namespace {

absl::Status Check(const kernels::Status& s) { return FromKernelStatus(s); }

// The indexer's k_norm: a LayerNorm with weight and bias, eps 1e-6, in
// float (biased variance, as torch's).
void LayerNorm(std::span<float> x, std::span<const float> weight, std::span<const float> bias) {
  float mean = 0.0f;
  for (float v : x) mean += v;
  mean /= static_cast<float>(x.size());
  float var = 0.0f;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= static_cast<float>(x.size());
  const float inv = 1.0f / std::sqrt(var + 1e-6f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (x[i] - mean) * inv * weight[i] + bias[i];
}

// A query head or key as the indexer rounds it: RoPE on halves over its
// first rope dims, the Hadamard rotation, FP8 with one scale.
absl::Status RotateAndRound(const kernels::RopeTable& rope, int64_t pos, std::span<float> v, std::span<uint8_t> codes,
                            float& scale) {
  rope.ApplyHalves(pos, v.first(rope.dim()));
  KVTIER_RETURN_IF_ERROR(Check(kernels::HadamardRotate(v)));
  return Check(kernels::QuantizeIndexerFp8(v, v.size(), codes, std::span(&scale, 1)));
}

}  // namespace

std::vector<PassRow> PassRows(std::span<const SequenceTokens> batch) {
  std::vector<PassRow> rows;
  for (const SequenceTokens& s : batch) {
    for (size_t i = 0; i < s.tokens.size(); ++i) rows.push_back({s.cache, s.cache->length + static_cast<int64_t>(i)});
  }
  return rows;
}

absl::Status AppendIndexKeys(const kernels::RopeTable& rope, std::span<const float> k_norm,
                             std::span<const float> k_norm_bias, size_t layer, std::span<const PassRow> rows,
                             std::span<float> keys) {
  const size_t dim = k_norm.size();
  if (keys.size() != rows.size() * dim) return absl::InvalidArgumentError("indexer keys do not fit the pass's rows");
  for (size_t r = 0; r < rows.size(); ++r) {
    std::span<float> k = keys.subspan(r * dim, dim);
    LayerNorm(k, k_norm, k_norm_bias);
    std::vector<uint8_t>& codes = rows[r].cache->index_keys[layer];
    codes.resize(codes.size() + dim);
    float scale = 0.0f;
    KVTIER_RETURN_IF_ERROR(RotateAndRound(rope, rows[r].pos, k, std::span(codes).last(dim), scale));
    rows[r].cache->index_scales[layer].push_back(scale);
  }
  return absl::OkStatus();
}

absl::Status IndexQuery(const IndexerConfig& ix, const kernels::RopeTable& rope, int64_t pos, std::span<float> queries,
                        std::span<const float> head_weights, std::span<uint8_t> q_codes, std::span<float> weights) {
  const size_t heads = ix.heads, dim = ix.head_dim;
  const float factor = 1.0f / std::sqrt(static_cast<float>(heads)) / std::sqrt(static_cast<float>(dim));
  for (size_t hd = 0; hd < heads; ++hd) {
    float q_scale = 0.0f;
    KVTIER_RETURN_IF_ERROR(
        RotateAndRound(rope, pos, queries.subspan(hd * dim, dim), q_codes.subspan(hd * dim, dim), q_scale));
    weights[hd] = head_weights[hd] * factor * q_scale;
  }
  return absl::OkStatus();
}

absl::Status IndexRows(const ModelConfig& c, const kernels::RopeTable& rope, const IndexerWeights& w, size_t layer,
                       std::span<const PassRow> rows, const float* h, const float* qa,
                       std::vector<std::vector<uint32_t>>& selected) {
  const IndexerConfig& ix = *c.indexer;
  const size_t n = rows.size(), hidden = c.hidden_size, q_lora = *c.q_lora_rank, heads = ix.heads, dim = ix.head_dim;
  std::vector<float> keys(n * dim);
  MatMul(w.wk, dim, hidden, h, n, keys.data());
  // Every row's key first: a row scores its own and earlier ones.
  KVTIER_RETURN_IF_ERROR(AppendIndexKeys(rope, w.k_norm, w.k_norm_bias, layer, rows, keys));
  selected.assign(n, {});
  // Queries only where some row sees more tokens than it may attend to.
  const bool sparse = std::any_of(rows.begin(), rows.end(), [&](const PassRow& r) { return r.pos + 1 > ix.topk; });
  if (!sparse) return absl::OkStatus();
  std::vector<float> queries(n * heads * dim), head_weights(n * heads);
  MatMul(w.wq_b, heads * dim, q_lora, qa, n, queries.data());
  MatMul(w.weights_proj, heads, hidden, h, n, head_weights.data());
  std::vector<uint8_t> q_codes(heads * dim);
  std::vector<float> weights(heads), scores;
  for (size_t r = 0; r < n; ++r) {
    const size_t visible = static_cast<size_t>(rows[r].pos) + 1;
    if (visible <= static_cast<size_t>(ix.topk)) continue;
    KVTIER_RETURN_IF_ERROR(IndexQuery(ix, rope, rows[r].pos, std::span(queries).subspan(r * heads * dim, heads * dim),
                                      std::span(head_weights).subspan(r * heads, heads), q_codes, weights));
    const SequenceCache& cache = *rows[r].cache;
    if (cache.index_scales[layer].size() < visible) {
      return absl::InvalidArgumentError(absl::StrCat("a sequence cache holds ", cache.index_scales[layer].size(),
                                                     " indexer keys at layer ", layer, ", not ", visible));
    }
    scores.resize(visible);
    KVTIER_RETURN_IF_ERROR(
        Check(kernels::IndexerScores(static_cast<uint32_t>(heads), static_cast<uint32_t>(dim), q_codes, weights,
                                     std::span(cache.index_keys[layer]).first(visible * dim),
                                     std::span(cache.index_scales[layer]).first(visible), scores)));
    kernels::SelectTopTokens(scores, static_cast<size_t>(ix.topk), selected[r]);
    std::sort(selected[r].begin(), selected[r].end());
  }
  return absl::OkStatus();
}

absl::Status GatherLatents(const SequenceCache& cache, size_t layer, std::span<const uint32_t> tokens,
                           uint32_t kv_lora_rank, uint32_t rope_dim, std::vector<float>& out) {
  const size_t dim = size_t{kv_lora_rank} + rope_dim, sealed = cache.blocks[layer].size() * cache.tokens_per_block;
  const kernels::BlockShape shape{cache.tokens_per_block, kv_lora_rank, rope_dim};
  out.resize(tokens.size() * dim);
  std::vector<uint32_t> in_block;
  for (size_t i = 0; i < tokens.size();) {
    const size_t t = tokens[i];
    if (t >= sealed) {  // the tail, in float
      if ((t - sealed + 1) * dim > cache.tail[layer].size()) {
        return absl::InvalidArgumentError(absl::StrCat("token ", t, " is past the sequence's latents"));
      }
      std::copy_n(cache.tail[layer].data() + (t - sealed) * dim, dim, out.data() + i * dim);
      ++i;
      continue;
    }
    // The run of tokens (ascending) in t's block, decoded together: the
    // block's scales read once, and only those tokens' bytes.
    const size_t b = t / shape.tokens, first = i;
    in_block.clear();
    for (; i < tokens.size() && tokens[i] / shape.tokens == b && tokens[i] < sealed; ++i) {
      in_block.push_back(static_cast<uint32_t>(tokens[i] % shape.tokens));
    }
    KVTIER_RETURN_IF_ERROR(
        Check(kernels::DequantizeTokens(cache.codec, shape, cache.blocks[layer][b], in_block,
                                        std::span(out).subspan(first * dim, in_block.size() * dim))));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::runtime
