#include "services/runtime/model_tensors.h"

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
#include "services/runtime/v4_tensors.h"

namespace kvtier::runtime {
namespace {

TensorSpec Float(std::string name, std::vector<int64_t> shape) {
  return {std::move(name), std::move(shape), DType::kBf16, false};
}

TensorSpec Projection(const ModelConfig& c, std::string name, int64_t out, int64_t in) {
  return {std::move(name), {out, in}, c.fp8.has_value() ? DType::kF8E4m3 : DType::kBf16, true};
}

MlpTensors Mlp(const ModelConfig& c, const std::string& prefix, int64_t inter) {
  const int64_t h = c.hidden_size;
  return {Projection(c, prefix + "gate_proj.weight", inter, h), Projection(c, prefix + "up_proj.weight", inter, h),
          Projection(c, prefix + "down_proj.weight", h, inter), inter};
}

absl::Status VisitMlp(const MlpTensors& m, const std::function<absl::Status(const TensorSpec&)>& visit) {
  KVTIER_RETURN_IF_ERROR(visit(m.gate));
  KVTIER_RETURN_IF_ERROR(visit(m.up));
  return visit(m.down);
}

}  // namespace

TensorSpec ScaleSpec(const TensorSpec& projection, const Fp8Quantization& fp8) {
  const auto blocks = [](int64_t n, int64_t block) { return (n + block - 1) / block; };
  return {projection.name + "_scale_inv",
          {blocks(projection.shape[0], fp8.block_rows), blocks(projection.shape[1], fp8.block_cols)},
          DType::kF32,
          false};
}

GlobalTensors GlobalTensorsOf(const ModelConfig& c) {
  return {Float("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}),
          Float("model.norm.weight", {c.hidden_size}), Float("lm_head.weight", {c.vocab_size, c.hidden_size})};
}

LayerTensors LayerTensorsOf(const ModelConfig& c, int64_t layer) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  const std::string p = absl::StrCat("model.layers.", layer, "."), a = p + "self_attn.";
  LayerTensors t;
  t.input_norm = Float(p + "input_layernorm.weight", {h});
  t.post_norm = Float(p + "post_attention_layernorm.weight", {h});
  if (c.q_lora_rank.has_value()) {
    t.q_a = Projection(c, a + "q_a_proj.weight", *c.q_lora_rank, h);
    t.q_a_norm = Float(a + "q_a_layernorm.weight", {*c.q_lora_rank});
    t.q_b = Projection(c, a + "q_b_proj.weight", heads * c.q_head_dim(), *c.q_lora_rank);
  } else {
    t.q_proj = Projection(c, a + "q_proj.weight", heads * c.q_head_dim(), h);
  }
  t.kv_a = Projection(c, a + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, h);
  t.kv_a_norm = Float(a + "kv_a_layernorm.weight", {c.kv_lora_rank});
  t.kv_b = Projection(c, a + "kv_b_proj.weight", heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
  t.o_proj = Projection(c, a + "o_proj.weight", h, heads * c.v_head_dim);
  if (c.indexer.has_value()) {
    const std::string i = a + "indexer.";
    const int64_t dim = c.indexer->head_dim;
    t.indexer =
        IndexerTensors{Projection(c, i + "wq_b.weight", c.indexer->heads * dim, *c.q_lora_rank),
                       Projection(c, i + "wk.weight", dim, h), Float(i + "k_norm.weight", {dim}),
                       Float(i + "k_norm.bias", {dim}), Float(i + "weights_proj.weight", {c.indexer->heads, h})};
  }
  t.moe = c.IsMoeLayer(layer);
  if (!t.moe) {
    t.mlp = Mlp(c, p + "mlp.", c.intermediate_size);
    return t;
  }
  t.router = Float(p + "mlp.gate.weight", {c.n_routed_experts, h});
  if (c.topk_method == TopkMethod::kNoauxTc) {
    t.correction_bias = TensorSpec{p + "mlp.gate.e_score_correction_bias", {c.n_routed_experts}, DType::kF32, false};
  }
  if (c.n_shared_experts > 0)
    t.shared = Mlp(c, p + "mlp.shared_experts.", c.moe_intermediate_size * c.n_shared_experts);
  return t;
}

MlpTensors ExpertTensors(const ModelConfig& c, int64_t layer, int64_t expert) {
  return Mlp(c, absl::StrCat("model.layers.", layer, ".mlp.experts.", expert, "."), c.moe_intermediate_size);
}

namespace {

// Layer i's tensors, its routed experts among them.
absl::Status VisitLayer(const ModelConfig& c, int64_t i, const std::function<absl::Status(const TensorSpec&)>& visit) {
  const LayerTensors t = LayerTensorsOf(c, i);
  for (const std::optional<TensorSpec>& spec :
       {std::optional(t.input_norm), std::optional(t.post_norm), t.q_a, t.q_a_norm, t.q_b, t.q_proj,
        std::optional(t.kv_a), std::optional(t.kv_a_norm), std::optional(t.kv_b), std::optional(t.o_proj)}) {
    if (spec.has_value()) KVTIER_RETURN_IF_ERROR(visit(*spec));
  }
  if (t.indexer.has_value()) {
    for (const TensorSpec* spec :
         {&t.indexer->wq_b, &t.indexer->wk, &t.indexer->k_norm, &t.indexer->k_norm_bias, &t.indexer->weights_proj}) {
      KVTIER_RETURN_IF_ERROR(visit(*spec));
    }
  }
  if (t.mlp.has_value()) return VisitMlp(*t.mlp, visit);
  KVTIER_RETURN_IF_ERROR(visit(*t.router));
  if (t.correction_bias.has_value()) KVTIER_RETURN_IF_ERROR(visit(*t.correction_bias));
  for (int64_t e = 0; e < c.n_routed_experts; ++e) KVTIER_RETURN_IF_ERROR(VisitMlp(ExpertTensors(c, i, e), visit));
  if (t.shared.has_value()) return VisitMlp(*t.shared, visit);
  return absl::OkStatus();
}

}  // namespace

absl::Status ForEachExpectedTensor(const ModelConfig& c, const std::function<absl::Status(const TensorSpec&)>& visit) {
  if (c.v4.has_value()) return ForEachV4Tensor(c, visit);
  const GlobalTensors global = GlobalTensorsOf(c);
  KVTIER_RETURN_IF_ERROR(visit(global.embed));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) KVTIER_RETURN_IF_ERROR(VisitLayer(c, i, visit));
  KVTIER_RETURN_IF_ERROR(visit(global.final_norm));
  return visit(global.lm_head);
}

absl::Status ForEachMtpTensor(const ModelConfig& c, const std::function<absl::Status(const TensorSpec&)>& visit) {
  if (c.v4.has_value()) return absl::OkStatus();  // V4's mtp.* are not described (make-model writes none)
  const int64_t h = c.hidden_size;
  for (int64_t i = c.num_hidden_layers; i < c.num_hidden_layers + c.num_nextn_predict_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    KVTIER_RETURN_IF_ERROR(visit(Float(p + "embed_tokens.weight", {c.vocab_size, h})));
    KVTIER_RETURN_IF_ERROR(visit(Float(p + "enorm.weight", {h})));
    KVTIER_RETURN_IF_ERROR(visit(Float(p + "hnorm.weight", {h})));
    KVTIER_RETURN_IF_ERROR(visit(Projection(c, p + "eh_proj.weight", h, 2 * h)));
    KVTIER_RETURN_IF_ERROR(VisitLayer(c, i, visit));
    KVTIER_RETURN_IF_ERROR(visit(Float(p + "shared_head.norm.weight", {h})));
    KVTIER_RETURN_IF_ERROR(visit(Float(p + "shared_head.head.weight", {c.vocab_size, h})));
  }
  return absl::OkStatus();
}

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c) {
  std::vector<TensorSpec> t;
  (void)ForEachExpectedTensor(c, [&](const TensorSpec& spec) {
    t.push_back(spec);
    return absl::OkStatus();
  });
  return t;
}

}  // namespace kvtier::runtime
