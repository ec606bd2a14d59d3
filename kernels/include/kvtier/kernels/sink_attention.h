// DeepSeek-V4's attention core: every head of a query attends to its row's
// entries (one shared key-value head, K = V) with a learned sink in the
// softmax's denominator, which takes weight and gives no value:
//   out_h = sum_e exp(s_he - m) k_e / (sum_e exp(s_he - m) + exp(sink_h - m)),
//   s_he = scale * (q_h . k_e), m = max_e s_he.
// The CPU's here; the GPU's in cuda_v4_attention.h.
#ifndef KVTIER_KERNELS_SINK_ATTENTION_H_
#define KVTIER_KERNELS_SINK_ATTENTION_H_

#include <cstddef>
#include <cstdint>

namespace kvtier::kernels {

struct SinkAttentionShape {
  uint32_t heads = 0, dim = 0;
  float scale = 1.0f;  // of the scores: 1 / sqrt(dim) in V4
};

// One row: q [heads][dim], entries [count][dim], sinks [heads]; out
// [heads][dim] (zero with no entries).
void SinkAttention(const SinkAttentionShape& shape, const float* q, const float* entries, size_t count,
                   const float* sinks, float* out);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_SINK_ATTENTION_H_
