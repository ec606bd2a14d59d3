// DeepSeek-V2 and the V3 family as their Hugging Face modeling code
// computes them, plainly, in double: per-head K and V expanded from the
// latents through kv_b_proj, no absorption, no quantization except where
// asked; V3's router and FP8 dequantization written here, apart from the
// engine's. Test-only and slow.
#ifndef KVTIER_TESTS_REFERENCE_NAIVE_MODEL_H_
#define KVTIER_TESTS_REFERENCE_NAIVE_MODEL_H_

#include <cstdint>
#include <vector>

#include "services/runtime/checkpoint.h"
#include "services/runtime/model.h"

namespace kvtier::testing {

// Logits after each of `tokens` (one row of vocab_size per token), the
// context at step p being tokens 0..p, every latent as computed here in
// double. With `stored`, the latents of tokens in full blocks (sealed after
// the step that fills them) are instead the values `stored` holds for them,
// dequantized: the runtime's own blocks, so that both sides attend over
// identical stored latents (rounding a float and a double latent to bf16 can
// differ by one step where they straddle a tie).
// `stored_from`: the first step that sees stored blocks (a prefill of the
// first N tokens runs on full-precision latents and seals its blocks at the
// end, so its blocks appear from step N on).
std::vector<std::vector<double>> NaiveLogits(const runtime::Checkpoint& ckpt, const std::vector<uint32_t>& tokens,
                                             const runtime::SequenceCache* stored = nullptr, size_t stored_from = 0);

// max |got - want| / max |want| over a row of logits.
double RelativeError(const std::vector<float>& got, const std::vector<double>& want);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_REFERENCE_NAIVE_MODEL_H_
