#include "kvtier/kernels/expert_groups.h"

#include <string>

namespace kvtier::kernels {

Status PlanExpertGroups(const std::vector<std::vector<int32_t>>& rows, const std::vector<std::vector<float>>& weights,
                        std::span<const uint32_t> inter, uint32_t tokens, ExpertGroups& out) {
  const size_t groups = rows.size();
  if (weights.size() != groups || inter.size() != groups) {
    return InvalidArgument("expert groups: " + std::to_string(groups) + " row lists, " +
                           std::to_string(weights.size()) + " weight lists, " + std::to_string(inter.size()) +
                           " intermediate sizes");
  }
  out = ExpertGroups();
  out.token_first.assign(size_t{tokens} + 1, 0);
  for (size_t g = 0; g < groups; ++g) {
    if (weights[g].size() != rows[g].size()) {
      return InvalidArgument("expert groups: group " + std::to_string(g) + " has " + std::to_string(rows[g].size()) +
                             " rows and " + std::to_string(weights[g].size()) + " weights");
    }
    out.count.push_back(static_cast<uint32_t>(rows[g].size()));
    out.first_pair.push_back(out.pair_token.size());
    out.first_inner.push_back(out.inner_values);
    out.inner_values += rows[g].size() * size_t{inter[g]};
    for (const int32_t t : rows[g]) {
      if (t < 0 || static_cast<uint32_t>(t) >= tokens) {
        return InvalidArgument("expert groups: group " + std::to_string(g) + " names token " + std::to_string(t) +
                               " of " + std::to_string(tokens));
      }
      out.pair_token.push_back(t);
      ++out.token_first[static_cast<size_t>(t) + 1];
    }
  }
  for (uint32_t t = 0; t < tokens; ++t) out.token_first[t + 1] += out.token_first[t];
  // Each token's pairs in the order the groups give them (a counting sort).
  out.token_pairs.resize(out.pairs());
  out.token_weights.resize(out.pairs());
  std::vector<int32_t> next(out.token_first.begin(), out.token_first.end() - 1);
  for (size_t g = 0, p = 0; g < groups; ++g) {
    for (size_t i = 0; i < rows[g].size(); ++i, ++p) {
      const int32_t slot = next[static_cast<size_t>(rows[g][i])]++;
      out.token_pairs[static_cast<size_t>(slot)] = static_cast<int32_t>(p);
      out.token_weights[static_cast<size_t>(slot)] = weights[g][i];
    }
  }
  return OkStatus();
}

}  // namespace kvtier::kernels
