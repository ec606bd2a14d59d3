// The latent layouts the cache benchmarks store: DeepSeek-V2-Lite's (27
// layers of 512 + 64) with the int8 codec, 1,026,468-byte blocks of 64
// tokens; DeepSeek-V4-Flash's own.
#ifndef KVTIER_LOAD_BENCH_LAYOUT_H_
#define KVTIER_LOAD_BENCH_LAYOUT_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "services/kvblock/block_format.h"
#include "services/kvblock/layout.h"

namespace kvtier::load {

inline kvblock::LatentLayout V2LiteInt8() {
  return {.model_id = "deepseek-v2-lite-bench",
          .num_layers = 27,
          .kv_lora_rank = 512,
          .rope_dim = 64,
          .tokens_per_block = 64,
          .codec = kernels::Codec::kInt8};
}

// DeepSeek-V4-Flash's first `layers` layers as it is released (block
// format 3): two window-only layers, ratios 4 and 128 alternating, a last
// 4; entries of 512 (64 rotated) in its FP8, MXFP4 indexer keys of 128, a
// window of 128.
inline kvblock::LatentLayout V4Flash(std::string model_id, uint32_t layers = 43, uint32_t tokens_per_block = 128) {
  kvblock::LatentLayout layout{.model_id = std::move(model_id),
                               .num_layers = layers,
                               .kv_lora_rank = 512,
                               .rope_dim = 64,
                               .tokens_per_block = tokens_per_block,
                               .codec = kernels::Codec::kFp8,
                               .block_format_version = kvblock::kV4BlockFormatVersion,
                               .indexer_dim = 128,
                               .indexer_encoding = kvblock::IndexerEncoding::kMxfp4};
  for (uint32_t l = 0; l < layers; ++l) layout.compress_ratios.push_back(l < 2 ? 0 : l % 2 == 0 ? 4 : 128);
  layout.sliding_window = 128;
  return layout;
}

// `blocks` blocks of random latents, each as one record a layer (the layer
// slices a prefill node sends).
inline std::vector<std::vector<std::string>> RandomBlockSlices(const kvblock::LatentLayout& layout, uint32_t blocks) {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(layout.LayerShape().values());
  std::vector<std::vector<std::string>> slices(blocks);
  for (auto& block : slices) {
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      for (float& v : x) v = normal(rng);
      block.push_back(*kvblock::EncodeBlock(layout, l, 1, x));
    }
  }
  return slices;
}

}  // namespace kvtier::load

#endif  // KVTIER_LOAD_BENCH_LAYOUT_H_
