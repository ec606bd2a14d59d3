#include "services/runtime/model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/mla_attention.h"
#include "services/common/status.h"

namespace kvtier::runtime {
namespace {

// y = W x for W [rows][cols] row-major.
void MatVec(const std::vector<float>& w, size_t rows, size_t cols, const float* x, float* y) {
  kernels::Gemv(w.data(), rows, cols, x, y);
}

// down(silu(gate x) * up x), accumulated into `out` times `weight`.
void SwiGlu(const std::vector<float>& gate, const std::vector<float>& up,
            const std::vector<float>& down, size_t inter, size_t hidden, const float* x,
            float weight, float* out) {
  std::vector<float> g(inter), u(inter), y(hidden);
  MatVec(gate, inter, hidden, x, g.data());
  MatVec(up, inter, hidden, x, u.data());
  for (size_t i = 0; i < inter; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  MatVec(down, hidden, inter, g.data(), y.data());
  for (size_t i = 0; i < hidden; ++i) out[i] += weight * y[i];
}

absl::Status Check(const kernels::Status& s) { return FromKernelStatus(s); }

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const Checkpoint& ckpt) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = ckpt.config();
  const ModelConfig& c = m->config_;
  const kernels::YarnParams* yarn = c.rope_scaling.has_value() ? &*c.rope_scaling : nullptr;
  KVTIER_RETURN_IF_ERROR(Check(kernels::RopeTable::Create(
      static_cast<uint32_t>(c.qk_rope_head_dim), c.rope_theta, yarn, m->rope_)));
  auto load = [&](const std::string& name) -> absl::StatusOr<std::vector<float>> {
    KVTIER_ASSIGN_OR_RETURN(TensorView t, ckpt.Tensor(name));
    return t.ToFloat();
  };
  KVTIER_ASSIGN_OR_RETURN(m->embed_, load("model.embed_tokens.weight"));
  KVTIER_ASSIGN_OR_RETURN(m->final_norm_, load("model.norm.weight"));
  KVTIER_ASSIGN_OR_RETURN(m->lm_head_, load("lm_head.weight"));
  const int64_t heads = c.num_attention_heads, nope = c.qk_nope_head_dim, v = c.v_head_dim,
                kv = c.kv_lora_rank;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer l;
    KVTIER_ASSIGN_OR_RETURN(l.input_norm, load(p + "input_layernorm.weight"));
    KVTIER_ASSIGN_OR_RETURN(l.post_norm, load(p + "post_attention_layernorm.weight"));
    if (c.q_lora_rank.has_value()) {
      KVTIER_ASSIGN_OR_RETURN(l.q_a, load(p + "self_attn.q_a_proj.weight"));
      KVTIER_ASSIGN_OR_RETURN(l.q_a_norm, load(p + "self_attn.q_a_layernorm.weight"));
      KVTIER_ASSIGN_OR_RETURN(l.q_b, load(p + "self_attn.q_b_proj.weight"));
    } else {
      KVTIER_ASSIGN_OR_RETURN(l.q_proj, load(p + "self_attn.q_proj.weight"));
    }
    KVTIER_ASSIGN_OR_RETURN(l.kv_a, load(p + "self_attn.kv_a_proj_with_mqa.weight"));
    KVTIER_ASSIGN_OR_RETURN(l.kv_a_norm, load(p + "self_attn.kv_a_layernorm.weight"));
    KVTIER_ASSIGN_OR_RETURN(std::vector<float> kv_b, load(p + "self_attn.kv_b_proj.weight"));
    // kv_b_proj rows per head: nope rows of W_UK, then v rows of W_UV.
    l.w_uk.resize(heads * nope * kv);
    l.w_uv.resize(heads * v * kv);
    for (int64_t h = 0; h < heads; ++h) {
      const float* head = kv_b.data() + h * (nope + v) * kv;
      std::copy_n(head, nope * kv, l.w_uk.data() + h * nope * kv);
      std::copy_n(head + nope * kv, v * kv, l.w_uv.data() + h * v * kv);
    }
    KVTIER_ASSIGN_OR_RETURN(l.o_proj, load(p + "self_attn.o_proj.weight"));
    l.moe = c.IsMoeLayer(i);
    if (!l.moe) {
      KVTIER_ASSIGN_OR_RETURN(l.gate_proj, load(p + "mlp.gate_proj.weight"));
      KVTIER_ASSIGN_OR_RETURN(l.up_proj, load(p + "mlp.up_proj.weight"));
      KVTIER_ASSIGN_OR_RETURN(l.down_proj, load(p + "mlp.down_proj.weight"));
    } else {
      KVTIER_ASSIGN_OR_RETURN(l.router, load(p + "mlp.gate.weight"));
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        const std::string ep = absl::StrCat(p, "mlp.experts.", e, ".");
        KVTIER_ASSIGN_OR_RETURN(std::vector<float> g, load(ep + "gate_proj.weight"));
        KVTIER_ASSIGN_OR_RETURN(std::vector<float> u, load(ep + "up_proj.weight"));
        KVTIER_ASSIGN_OR_RETURN(std::vector<float> d, load(ep + "down_proj.weight"));
        l.expert_gate.push_back(std::move(g));
        l.expert_up.push_back(std::move(u));
        l.expert_down.push_back(std::move(d));
      }
      if (c.n_shared_experts > 0) {
        KVTIER_ASSIGN_OR_RETURN(l.shared_gate, load(p + "mlp.shared_experts.gate_proj.weight"));
        KVTIER_ASSIGN_OR_RETURN(l.shared_up, load(p + "mlp.shared_experts.up_proj.weight"));
        KVTIER_ASSIGN_OR_RETURN(l.shared_down, load(p + "mlp.shared_experts.down_proj.weight"));
      }
    }
    m->layers_.push_back(std::move(l));
  }
  return m;
}

SequenceCache Model::NewCache(kernels::Codec codec, uint32_t tokens_per_block) const {
  SequenceCache cache;
  cache.codec = codec;
  cache.tokens_per_block = tokens_per_block;
  cache.blocks.resize(layers_.size());
  cache.tail.resize(layers_.size());
  return cache;
}

void Model::Mlp(const Layer& l, std::span<const float> x, std::span<float> out) const {
  const ModelConfig& c = config_;
  const size_t hidden = c.hidden_size;
  std::fill(out.begin(), out.end(), 0.0f);
  if (!l.moe) {
    SwiGlu(l.gate_proj, l.up_proj, l.down_proj, c.intermediate_size, hidden, x.data(), 1.0f, out.data());
    return;
  }
  std::vector<float> router_logits(c.n_routed_experts);
  MatVec(l.router, c.n_routed_experts, hidden, x.data(), router_logits.data());
  kernels::GateParams gate;
  gate.top_k = static_cast<uint32_t>(c.num_experts_per_tok);
  gate.group_limited = c.topk_method == TopkMethod::kGroupLimitedGreedy;
  gate.n_group = static_cast<uint32_t>(c.n_group);
  gate.topk_group = static_cast<uint32_t>(c.topk_group);
  gate.norm_topk_prob = c.norm_topk_prob;
  gate.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  std::vector<kernels::ExpertChoice> chosen;
  // Parameters were validated with the config, so selection cannot fail.
  (void)kernels::SelectExperts(router_logits, gate, chosen);
  for (const kernels::ExpertChoice& e : chosen) {
    SwiGlu(l.expert_gate[e.expert], l.expert_up[e.expert], l.expert_down[e.expert],
           c.moe_intermediate_size, hidden, x.data(), e.weight, out.data());
  }
  if (c.n_shared_experts > 0) {
    SwiGlu(l.shared_gate, l.shared_up, l.shared_down, c.moe_intermediate_size * c.n_shared_experts,
           hidden, x.data(), 1.0f, out.data());
  }
}

absl::Status Model::Step(uint32_t token, SequenceCache& cache, std::span<float> logits) const {
  return Prefill(std::span(&token, 1), cache, logits);
}

absl::Status Model::Prefill(std::span<const uint32_t> tokens, SequenceCache& cache,
                            std::span<float> logits) const {
  const ModelConfig& c = config_;
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens to run");
  for (uint32_t token : tokens) {
    if (token >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token ", token, " outside the vocabulary of ", c.vocab_size));
    }
  }
  if (logits.size() != static_cast<size_t>(c.vocab_size) || cache.tail.size() != layers_.size()) {
    return absl::InvalidArgumentError("logits or cache do not fit this model");
  }
  // Token by token through all layers is the causal pass: token i's layer-l
  // input depends only on tokens <= i. Blocks are sealed after the pass, so
  // every token of it attends over full-precision latents.
  for (size_t i = 0; i < tokens.size(); ++i) {
    KVTIER_RETURN_IF_ERROR(RunToken(tokens[i], cache, i + 1 == tokens.size() ? logits : std::span<float>()));
  }
  return SealFullBlocks(cache);
}

absl::Status Model::SealFullBlocks(SequenceCache& cache) const {
  const kernels::BlockShape shape{cache.tokens_per_block, static_cast<uint32_t>(config_.kv_lora_rank),
                                  static_cast<uint32_t>(config_.qk_rope_head_dim)};
  while (cache.tail[0].size() >= shape.values()) {
    for (size_t li = 0; li < layers_.size(); ++li) {
      std::vector<uint8_t> payload(kernels::EncodedBytes(cache.codec, shape));
      KVTIER_RETURN_IF_ERROR(Check(kernels::Quantize(
          cache.codec, shape, std::span<const float>(cache.tail[li]).first(shape.values()), payload)));
      cache.blocks[li].push_back(std::move(payload));
      cache.tail[li].erase(cache.tail[li].begin(), cache.tail[li].begin() + shape.values());
    }
  }
  return absl::OkStatus();
}

absl::Status Model::RunToken(uint32_t token, SequenceCache& cache, std::span<float> logits) const {
  const ModelConfig& c = config_;
  const size_t hidden = c.hidden_size, heads = c.num_attention_heads, nope = c.qk_nope_head_dim,
               rope = c.qk_rope_head_dim, qdim = c.q_head_dim(), kv = c.kv_lora_rank, v = c.v_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t pos = cache.length;
  std::vector<float> x(embed_.begin() + token * hidden, embed_.begin() + (token + 1) * hidden);
  std::vector<float> h(hidden), q(heads * qdim), q_latent(heads * kv), q_pe(heads * rope),
      latent(kv + rope), attn_latent(heads * kv), attn(heads * v), delta(hidden);
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& l = layers_[li];
    KVTIER_RETURN_IF_ERROR(Check(kernels::RmsNorm(x, l.input_norm, eps, h)));
    if (c.q_lora_rank.has_value()) {
      std::vector<float> qa(*c.q_lora_rank);
      MatVec(l.q_a, qa.size(), hidden, h.data(), qa.data());
      KVTIER_RETURN_IF_ERROR(Check(kernels::RmsNorm(qa, l.q_a_norm, eps, qa)));
      MatVec(l.q_b, q.size(), qa.size(), qa.data(), q.data());
    } else {
      MatVec(l.q_proj, q.size(), hidden, h.data(), q.data());
    }
    for (size_t hd = 0; hd < heads; ++hd) {
      std::span<float> pe(q_pe.data() + hd * rope, rope);
      std::copy_n(q.data() + hd * qdim + nope, rope, pe.begin());
      rope_.Apply(pos, pe);
      // Absorb W_UK: q_latent = W_UK^T q_nope.
      const float* qn = q.data() + hd * qdim;
      float* ql = q_latent.data() + hd * kv;
      std::fill(ql, ql + kv, 0.0f);
      for (size_t i = 0; i < nope; ++i) {
        const float* w = l.w_uk.data() + (hd * nope + i) * kv;
        for (size_t j = 0; j < kv; ++j) ql[j] += w[j] * qn[i];
      }
    }
    MatVec(l.kv_a, kv + rope, hidden, h.data(), latent.data());
    std::span<float> compressed(latent.data(), kv), k_pe(latent.data() + kv, rope);
    KVTIER_RETURN_IF_ERROR(Check(kernels::RmsNorm(compressed, l.kv_a_norm, eps, compressed)));
    rope_.Apply(pos, k_pe);
    cache.tail[li].insert(cache.tail[li].end(), latent.begin(), latent.end());

    std::vector<kernels::LatentBlock> blocks;
    for (const auto& payload : cache.blocks[li]) {
      blocks.push_back({cache.codec, cache.tokens_per_block, payload});
    }
    KVTIER_RETURN_IF_ERROR(Check(kernels::AbsorbedMlaDecode(
        {static_cast<uint32_t>(heads), static_cast<uint32_t>(kv), static_cast<uint32_t>(rope)},
        q_latent, q_pe, static_cast<float>(c.SoftmaxScale()), blocks, cache.tail[li], attn_latent)));
    for (size_t hd = 0; hd < heads; ++hd) {  // W_UV after the weighted sum
      kernels::Gemv(l.w_uv.data() + hd * v * kv, v, kv, attn_latent.data() + hd * kv,
                    attn.data() + hd * v);
    }
    MatVec(l.o_proj, hidden, heads * v, attn.data(), delta.data());
    for (size_t i = 0; i < hidden; ++i) x[i] += delta[i];
    KVTIER_RETURN_IF_ERROR(Check(kernels::RmsNorm(x, l.post_norm, eps, h)));
    Mlp(l, h, delta);
    for (size_t i = 0; i < hidden; ++i) x[i] += delta[i];
  }
  ++cache.length;
  if (logits.empty()) return absl::OkStatus();  // a prompt token before the last
  KVTIER_RETURN_IF_ERROR(Check(kernels::RmsNorm(x, final_norm_, eps, h)));
  MatVec(lm_head_, c.vocab_size, hidden, h.data(), logits.data());
  return absl::OkStatus();
}

}  // namespace kvtier::runtime
