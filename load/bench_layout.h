// The latent layout the cache benchmarks store: DeepSeek-V2-Lite's (27
// layers of 512 + 64) with the int8 codec, 1,026,468-byte blocks of 64
// tokens.
#ifndef KVTIER_LOAD_BENCH_LAYOUT_H_
#define KVTIER_LOAD_BENCH_LAYOUT_H_

#include "services/kvblock/layout.h"

namespace kvtier::load {

inline kvblock::LatentLayout V2LiteInt8() {
  return {.model_id = "deepseek-v2-lite-bench", .num_layers = 27, .kv_lora_rank = 512, .rope_dim = 64,
          .tokens_per_block = 64, .codec = kernels::Codec::kInt8};
}

}  // namespace kvtier::load

#endif  // KVTIER_LOAD_BENCH_LAYOUT_H_
