// DeepSeek-V2 as its Hugging Face modeling code computes it, plainly, in
// double: per-head K and V expanded from the latents through kv_b_proj,
// no absorption, no quantization except where asked. Test-only and slow.
#ifndef KVTIER_TESTS_REFERENCE_NAIVE_MODEL_H_
#define KVTIER_TESTS_REFERENCE_NAIVE_MODEL_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "kvtier/kernels/codec.h"
#include "services/runtime/checkpoint.h"

namespace kvtier::testing {

// Logits after each of `tokens` (one row of vocab_size per token), the
// context at step p being tokens 0..p. With `codec`, the latents of tokens
// in full blocks (of `tokens_per_block`, sealed after the step that fills
// them) are rounded through the codec first, as a cache would store them.
std::vector<std::vector<double>> NaiveLogits(const runtime::Checkpoint& ckpt,
                                             const std::vector<uint32_t>& tokens,
                                             std::optional<kernels::Codec> codec,
                                             uint32_t tokens_per_block);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_REFERENCE_NAIVE_MODEL_H_
