// Where an MoE layer's (token, expert) pairs lie in one set of buffers, so
// that each token's inputs are gathered in one pass, each expert's GEMMs
// read and write their own slice, and each token's weighted sum of its
// experts' outputs is one pass (the CUDA MoE, cuda_matmul.h). Plain C++:
// built and tested without CUDA.
#ifndef KVTIER_KERNELS_EXPERT_GROUPS_H_
#define KVTIER_KERNELS_EXPERT_GROUPS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/kernels/status.h"

namespace kvtier::kernels {

struct ExpertGroups {
  // Group g's pairs are rows first_pair[g] .. first_pair[g] + count[g] - 1
  // of the gathered inputs ([pairs][hidden]) and of the experts' outputs;
  // its intermediate values ([count[g]][inter[g]]) start at
  // first_inner[g] of the gate, up and SwiGLU buffers.
  std::vector<uint32_t> count;
  std::vector<size_t> first_pair, first_inner;
  size_t inner_values = 0;          // sum of count[g] * inter[g]
  std::vector<int32_t> pair_token;  // [pairs]: the token a pair reads
  // Token t's pairs, groups in order: token_pairs[token_first[t] ..
  // token_first[t + 1] - 1], each with its weight. Summed in this order,
  // a token's output is what adding the groups' outputs one group after
  // another gives.
  std::vector<int32_t> token_first;  // [tokens + 1]
  std::vector<int32_t> token_pairs;
  std::vector<float> token_weights;

  size_t pairs() const { return pair_token.size(); }
};

// Group g (an expert, with intermediate size inter[g]) takes tokens
// rows[g] with weights weights[g]. INVALID_ARGUMENT when the lists'
// lengths disagree or a row is not a token in [0, tokens).
Status PlanExpertGroups(const std::vector<std::vector<int32_t>>& rows, const std::vector<std::vector<float>>& weights,
                        std::span<const uint32_t> inter, uint32_t tokens, ExpertGroups& out);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_EXPERT_GROUPS_H_
