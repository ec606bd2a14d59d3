#include "services/runtime/v4_tensors.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "services/base/status.h"

namespace kvtier::runtime {
namespace {

// A projection as published: FP8 in a quantized checkpoint, else bf16.
TensorSpec Projection(const ModelConfig& c, std::string name, int64_t out, int64_t in) {
  return {std::move(name), {out, in}, c.fp8.has_value() ? DType::kF8E4m3 : DType::kBf16, /*projection=*/true};
}
TensorSpec Vector(std::string name, int64_t n, DType dtype = DType::kBf16) { return {std::move(name), {n}, dtype}; }

V4HcTensors Hc(const std::string& prefix, int64_t rows, int64_t hc, int64_t hidden, int64_t scales) {
  return {{prefix + "_fn", {rows, hc * hidden}, DType::kF32},
          Vector(prefix + "_base", rows, DType::kF32),
          Vector(prefix + "_scale", scales, DType::kF32)};
}

V4CompressorTensors Compressor(const std::string& prefix, int64_t ratio, int64_t dim, int64_t hidden) {
  const int64_t width = (ratio == 4 ? 2 : 1) * dim;
  return {{prefix + ".ape", {ratio, width}, DType::kF32},
          {prefix + ".wkv.weight", {width, hidden}},
          {prefix + ".wgate.weight", {width, hidden}},
          Vector(prefix + ".norm.weight", dim)};
}

// An expert's SwiGLU; routed experts of an fp4 checkpoint as I8 bytes.
MlpTensors Expert(const std::string& prefix, const ModelConfig& c, bool routed) {
  const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size;
  const auto spec = [&](const std::string& name, int64_t out, int64_t in) {
    if (routed && c.v4->fp4_experts) return TensorSpec{prefix + name, {out, in / 2}, DType::kI8, true};
    return Projection(c, prefix + name, out, in);
  };
  return {spec(".w1.weight", inter, hidden), spec(".w3.weight", inter, hidden), spec(".w2.weight", hidden, inter),
          inter};
}

}  // namespace

V4GlobalTensors V4GlobalTensorsOf(const ModelConfig& c) {
  const int64_t hc = c.v4->hc_mult;
  return {{"embed.weight", {c.vocab_size, c.hidden_size}},
          Vector("norm.weight", c.hidden_size),
          {"head.weight", {c.vocab_size, c.hidden_size}},
          Hc("hc_head", hc, hc, c.hidden_size, 1)};
}

V4LayerTensors V4LayerTensorsOf(const ModelConfig& c, int64_t layer) {
  const V4Config& v4 = *c.v4;
  const std::string p = absl::StrCat("layers.", layer, ".");
  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads, hd = v4.head_dim, hc = v4.hc_mult;
  const int64_t q_lora = *c.q_lora_rank, ratio = v4.compress_ratios[static_cast<size_t>(layer)];
  V4LayerTensors t{
      .hc_attn = Hc(p + "hc_attn", (2 + hc) * hc, hc, hidden, 3),
      .hc_ffn = Hc(p + "hc_ffn", (2 + hc) * hc, hc, hidden, 3),
      .attn_norm = Vector(p + "attn_norm.weight", hidden),
      .ffn_norm = Vector(p + "ffn_norm.weight", hidden),
      .attn_sink = Vector(p + "attn.attn_sink", heads, DType::kF32),
      .wq_a = Projection(c, p + "attn.wq_a.weight", q_lora, hidden),
      .q_norm = Vector(p + "attn.q_norm.weight", q_lora),
      .wq_b = Projection(c, p + "attn.wq_b.weight", heads * hd, q_lora),
      .wkv = Projection(c, p + "attn.wkv.weight", hd, hidden),
      .kv_norm = Vector(p + "attn.kv_norm.weight", hd),
      .wo_a = Projection(c, p + "attn.wo_a.weight", v4.o_groups * v4.o_lora_rank, heads * hd / v4.o_groups),
      .wo_b = Projection(c, p + "attn.wo_b.weight", hidden, v4.o_groups * v4.o_lora_rank),
      .gate = {p + "ffn.gate.weight", {c.n_routed_experts, hidden}},
      .shared = Expert(p + "ffn.shared_experts", c, /*routed=*/false),
  };
  if (ratio > 0) t.compressor = Compressor(p + "attn.compressor", ratio, hd, hidden);
  if (ratio == 4) {
    const int64_t ih = c.indexer->heads, ihd = c.indexer->head_dim;
    t.indexer = V4IndexerTensors{Projection(c, p + "attn.indexer.wq_b.weight", ih * ihd, q_lora),
                                 {p + "attn.indexer.weights_proj.weight", {ih, hidden}},
                                 Compressor(p + "attn.indexer.compressor", ratio, ihd, hidden)};
  }
  if (layer < v4.num_hash_layers) {
    t.tid2eid = TensorSpec{p + "ffn.gate.tid2eid", {c.vocab_size, c.num_experts_per_tok}, DType::kI32};
  } else {
    t.gate_bias = Vector(p + "ffn.gate.bias", c.n_routed_experts, DType::kF32);
  }
  return t;
}

MlpTensors V4ExpertTensors(const ModelConfig& c, int64_t layer, int64_t expert) {
  return Expert(absl::StrCat("layers.", layer, ".ffn.experts.", expert), c, /*routed=*/true);
}

TensorSpec V4ScaleSpec(const TensorSpec& projection, const ModelConfig& c) {
  const std::string& name = projection.name;
  const std::string base = name.substr(0, name.size() - std::string(".weight").size());
  if (projection.dtype == DType::kI8) {  // [out][in / 2] bytes: a scale per 32 values
    return {base + ".scale", {projection.shape[0], projection.shape[1] * 2 / 32}, DType::kF8E8m0};
  }
  const auto blocks = [](int64_t n, int64_t block) { return (n + block - 1) / block; };
  return {base + ".scale",
          {blocks(projection.shape[0], c.fp8->block_rows), blocks(projection.shape[1], c.fp8->block_cols)},
          DType::kF8E8m0};
}

absl::Status ForEachV4Tensor(const ModelConfig& c, const std::function<absl::Status(const TensorSpec&)>& visit) {
  const auto hc = [&](const V4HcTensors& t) -> absl::Status {
    KVTIER_RETURN_IF_ERROR(visit(t.fn));
    KVTIER_RETURN_IF_ERROR(visit(t.base));
    return visit(t.scale);
  };
  const auto compressor = [&](const V4CompressorTensors& t) -> absl::Status {
    for (const TensorSpec* s : {&t.ape, &t.wkv, &t.wgate, &t.norm}) KVTIER_RETURN_IF_ERROR(visit(*s));
    return absl::OkStatus();
  };
  const auto mlp = [&](const MlpTensors& t) -> absl::Status {
    for (const TensorSpec* s : {&t.gate, &t.up, &t.down}) KVTIER_RETURN_IF_ERROR(visit(*s));
    return absl::OkStatus();
  };
  const V4GlobalTensors g = V4GlobalTensorsOf(c);
  KVTIER_RETURN_IF_ERROR(visit(g.embed));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const V4LayerTensors t = V4LayerTensorsOf(c, i);
    KVTIER_RETURN_IF_ERROR(hc(t.hc_attn));
    KVTIER_RETURN_IF_ERROR(hc(t.hc_ffn));
    for (const TensorSpec* s : {&t.attn_norm, &t.ffn_norm, &t.attn_sink, &t.wq_a, &t.q_norm, &t.wq_b, &t.wkv,
                                &t.kv_norm, &t.wo_a, &t.wo_b, &t.gate}) {
      KVTIER_RETURN_IF_ERROR(visit(*s));
    }
    if (t.compressor.has_value()) KVTIER_RETURN_IF_ERROR(compressor(*t.compressor));
    if (t.indexer.has_value()) {
      KVTIER_RETURN_IF_ERROR(visit(t.indexer->wq_b));
      KVTIER_RETURN_IF_ERROR(visit(t.indexer->weights_proj));
      KVTIER_RETURN_IF_ERROR(compressor(t.indexer->compressor));
    }
    KVTIER_RETURN_IF_ERROR(visit(t.gate_bias.has_value() ? *t.gate_bias : *t.tid2eid));
    for (int64_t e = 0; e < c.n_routed_experts; ++e) KVTIER_RETURN_IF_ERROR(mlp(V4ExpertTensors(c, i, e)));
    KVTIER_RETURN_IF_ERROR(mlp(t.shared));
  }
  KVTIER_RETURN_IF_ERROR(visit(g.norm));
  KVTIER_RETURN_IF_ERROR(visit(g.head));
  return hc(g.hc_head);
}

}  // namespace kvtier::runtime
