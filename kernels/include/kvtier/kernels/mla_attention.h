// Absorbed MLA decode attention over stored latents (DeepSeek-V2, FlashMLA's
// job on GPUs). For one new token of one sequence, per head h:
//
//   score[h][t] = scale * (q_latent[h] . c_t + q_rope[h] . r_t)
//   p[h] = softmax over t of score[h]
//   out[h] = sum_t p[h][t] * c_t
//
// where c_t is token t's compressed_kv (after kv_a_layernorm) and r_t its
// k_pe. q_latent[h] is q_nope[h] with W_UK folded in (W_UK[h]^T q_nope[h]);
// the caller applies W_UV[h] to out[h]. Blocks are read as stored: int8/int4
// per-channel scales fold into the query and into the output instead of
// dequantizing K or V; bf16 and fp8 blocks are widened to floats. Each block
// is read once, its weighted sums taken right after its scores, with the
// softmax computed online (a running largest score and sum per head).
#ifndef KVTIER_KERNELS_MLA_ATTENTION_H_
#define KVTIER_KERNELS_MLA_ATTENTION_H_

#include <cstdint>
#include <span>

#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/status.h"

namespace kvtier::kernels {

struct MlaShape {
  uint32_t heads = 0;
  uint32_t kv_lora_rank = 0;
  uint32_t rope_dim = 0;
};

// One layer's latents for `tokens` consecutive tokens, in `codec`'s layout.
struct LatentBlock {
  Codec codec = Codec::kBf16;
  uint32_t tokens = 0;
  std::span<const uint8_t> payload;
};

// `blocks` (in sequence order) then `tail` (float rows of kv_lora_rank +
// rope_dim values, the tokens not yet in a full block) are the context.
// q_latent: heads x kv_lora_rank; q_rope: heads x rope_dim; out: heads x
// kv_lora_rank. INVALID_ARGUMENT for sizes that disagree or no context.
Status AbsorbedMlaDecode(const MlaShape& shape, std::span<const float> q_latent, std::span<const float> q_rope,
                         float softmax_scale, std::span<const LatentBlock> blocks, std::span<const float> tail,
                         std::span<float> out);

// For tests: false sends AbsorbedMlaDecode and AbsorbQueries down their
// portable paths (no VNNI, AVX2 or AVX-512 tiles), as on CPUs without them.
void SetAttentionTilesForTesting(bool enabled);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_MLA_ATTENTION_H_
