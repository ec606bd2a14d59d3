// DeepSeek-V4's hyper-connections: the residual stream is hc copies of the
// hidden state. Before each attention and MoE half, weights computed from
// all copies (one product, then Sinkhorn for the copy-to-copy mixing)
// reduce the copies to the half's input; after it, the output is spread
// back over the copies, mixed with them. As model.py's Block.hc_pre and
// hc_post and kernel.py's hc_split_sinkhorn compute them.
#ifndef KVTIER_SERVICES_RUNTIME_HYPER_CONNECTIONS_H_
#define KVTIER_SERVICES_RUNTIME_HYPER_CONNECTIONS_H_

#include <cstddef>
#include <vector>

namespace kvtier::runtime {

// One half's mixing parameters: fn [(2 + hc) * hc][hc * hidden], base
// [(2 + hc) * hc], scale [3].
struct HcParams {
  std::vector<float> fn, base, scale;
};

// One row's weights: pre [hc] (reduce), post [hc] (spread the output),
// comb [hc][hc] (copy j's share in new copy k at j * hc + k).
struct HcWeights {
  std::vector<float> pre, post, comb;
};

struct HcShape {
  size_t hc = 4, hidden = 0;
  float norm_eps = 1e-6f;  // of the rows' RMS
  float eps = 1e-6f;       // hc_eps
  int sinkhorn_iters = 20;
};

// For each of n rows of x ([n][hc][hidden]): its weights, and out[n][hidden]
// the copies reduced by pre.
void HcPre(const HcParams& p, const HcShape& shape, const float* x, size_t n, std::vector<HcWeights>& weights,
           float* out);

// x[n][hc][hidden] becomes, per row, copy k = post[k] * branch + sum_j
// comb[j][k] * x[j].
void HcPost(const HcShape& shape, const std::vector<HcWeights>& weights, const float* branch, size_t n, float* x);

// The head's reduction: fn [hc][hc * hidden], base [hc], scale [1]; pre =
// sigmoid(mix * scale + base) + eps, no Sinkhorn. out[n][hidden].
void HcHead(const HcParams& p, const HcShape& shape, const float* x, size_t n, float* out);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_HYPER_CONNECTIONS_H_
