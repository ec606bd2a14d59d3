#include "services/runtime/model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kvtier/kernels/expanded_attention.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/mla_attention.h"
#include "kvtier/kernels/parallel.h"
#include "services/common/status.h"
#include "services/runtime/matmul.h"
#if KVTIER_RUNTIME_CUDA
#include "services/runtime/cuda_forward.h"
#endif

namespace kvtier::runtime {
namespace {

absl::Status Check(const kernels::Status& s) { return FromKernelStatus(s); }

}  // namespace

absl::StatusOr<Device> ParseDevice(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return absl::InvalidArgumentError(absl::StrCat("--device ", name, " is not one of cpu, cuda"));
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const Checkpoint& ckpt, Device device,
                                                   [[maybe_unused]] const CudaOptions& cuda) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = ckpt.config();
  m->tokenizer_class_ = ckpt.tokenizer_class();
  const ModelConfig& c = m->config_;
  const kernels::YarnParams* yarn = c.rope_scaling.has_value() ? &*c.rope_scaling : nullptr;
  KVTIER_RETURN_IF_ERROR(
      Check(kernels::RopeTable::Create(static_cast<uint32_t>(c.qk_rope_head_dim), c.rope_theta, yarn, m->rope_)));
  if (device == Device::kCuda) {
#if KVTIER_RUNTIME_CUDA
    KVTIER_ASSIGN_OR_RETURN(m->device_, LoadCudaForward(ckpt, m->rope_, cuda));
    return m;
#else
    return absl::FailedPreconditionError(
        "--device cuda: this build has no CUDA backend (nvcc was not found when it was configured)");
#endif
  }
  auto load = [&](const std::string& name) -> absl::StatusOr<std::vector<float>> {
    KVTIER_ASSIGN_OR_RETURN(TensorView t, ckpt.Tensor(name));
    return t.ToFloat();
  };
  auto load_matrix = [&](const std::string& name) -> absl::StatusOr<WeightMatrix> {
    KVTIER_ASSIGN_OR_RETURN(TensorView t, ckpt.Tensor(name));
    return ToWeightMatrix(t);
  };
  KVTIER_ASSIGN_OR_RETURN(m->embed_, load_matrix("model.embed_tokens.weight"));
  KVTIER_ASSIGN_OR_RETURN(m->final_norm_, load("model.norm.weight"));
  KVTIER_ASSIGN_OR_RETURN(m->lm_head_, load_matrix("lm_head.weight"));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer l;
    KVTIER_ASSIGN_OR_RETURN(l.input_norm, load(p + "input_layernorm.weight"));
    KVTIER_ASSIGN_OR_RETURN(l.post_norm, load(p + "post_attention_layernorm.weight"));
    if (c.q_lora_rank.has_value()) {
      KVTIER_ASSIGN_OR_RETURN(l.q_a, load_matrix(p + "self_attn.q_a_proj.weight"));
      KVTIER_ASSIGN_OR_RETURN(l.q_a_norm, load(p + "self_attn.q_a_layernorm.weight"));
      KVTIER_ASSIGN_OR_RETURN(l.q_b, load_matrix(p + "self_attn.q_b_proj.weight"));
    } else {
      KVTIER_ASSIGN_OR_RETURN(l.q_proj, load_matrix(p + "self_attn.q_proj.weight"));
    }
    KVTIER_ASSIGN_OR_RETURN(l.kv_a, load_matrix(p + "self_attn.kv_a_proj_with_mqa.weight"));
    KVTIER_ASSIGN_OR_RETURN(l.kv_a_norm, load(p + "self_attn.kv_a_layernorm.weight"));
    KVTIER_ASSIGN_OR_RETURN(std::vector<float> kv_b, load(p + "self_attn.kv_b_proj.weight"));
    KvBWeights split = SplitKvB(kv_b, c);
    l.w_uk = std::move(split.w_uk);
    l.w_uv = std::move(split.w_uv);
    KVTIER_ASSIGN_OR_RETURN(l.o_proj, load_matrix(p + "self_attn.o_proj.weight"));
    l.moe = c.IsMoeLayer(i);
    auto load_swiglu = [&](const std::string& prefix, size_t inter) -> absl::StatusOr<SwiGluWeights> {
      SwiGluWeights w;
      w.inter = inter;
      KVTIER_ASSIGN_OR_RETURN(w.gate, load_matrix(prefix + "gate_proj.weight"));
      KVTIER_ASSIGN_OR_RETURN(w.up, load_matrix(prefix + "up_proj.weight"));
      KVTIER_ASSIGN_OR_RETURN(w.down, load_matrix(prefix + "down_proj.weight"));
      return w;
    };
    if (!l.moe) {
      KVTIER_ASSIGN_OR_RETURN(l.mlp, load_swiglu(p + "mlp.", c.intermediate_size));
    } else {
      MoeWeights& moe = l.experts;
      KVTIER_ASSIGN_OR_RETURN(moe.router, load(p + "mlp.gate.weight"));
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        KVTIER_ASSIGN_OR_RETURN(SwiGluWeights expert,
                                load_swiglu(absl::StrCat(p, "mlp.experts.", e, "."), c.moe_intermediate_size));
        moe.experts.push_back(std::move(expert));
      }
      if (c.n_shared_experts > 0) {
        KVTIER_ASSIGN_OR_RETURN(moe.shared,
                                load_swiglu(p + "mlp.shared_experts.", c.moe_intermediate_size * c.n_shared_experts));
      }
      moe.gate = c.Gate();
    }
    m->layers_.push_back(std::move(l));
  }
  return m;
}

SequenceCache Model::NewCache(kernels::Codec codec, uint32_t tokens_per_block) const {
  SequenceCache cache;
  cache.codec = codec;
  cache.tokens_per_block = tokens_per_block;
  cache.blocks.resize(static_cast<size_t>(config_.num_hidden_layers));
  cache.tail.resize(static_cast<size_t>(config_.num_hidden_layers));
  return cache;
}

absl::Status Model::Step(uint32_t token, SequenceCache& cache, std::span<float> logits) const {
  return Prefill(std::span(&token, 1), cache, logits);
}

absl::Status Model::Prefill(std::span<const uint32_t> tokens, SequenceCache& cache, std::span<float> logits) const {
  const SequenceTokens one{tokens, &cache, logits};
  return Forward(std::span(&one, 1));
}

absl::Status Model::CheckBatch(std::span<const SequenceTokens> batch) const {
  const ModelConfig& c = config_;
  if (batch.empty()) return absl::InvalidArgumentError("no sequences to run");
  for (size_t b = 0; b < batch.size(); ++b) {
    const SequenceTokens& s = batch[b];
    if (s.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("sequence ", b, " has no tokens to run"));
    for (uint32_t token : s.tokens) {
      if (token >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token ", token, " outside the vocabulary of ", c.vocab_size));
      }
    }
    if (s.cache == nullptr || s.logits.size() != static_cast<size_t>(c.vocab_size) ||
        s.cache->tail.size() != static_cast<size_t>(c.num_hidden_layers) ||
        s.cache->blocks.size() != static_cast<size_t>(c.num_hidden_layers)) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", b, ": logits or cache do not fit this model"));
    }
    for (size_t other = 0; other < b; ++other) {
      if (batch[other].cache == s.cache) {
        return absl::InvalidArgumentError(absl::StrCat("sequences ", other, " and ", b, " share a cache"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Model::Forward(std::span<const SequenceTokens> batch, const LayerDone& on_layer) const {
  KVTIER_RETURN_IF_ERROR(CheckBatch(batch));
  if (device_ != nullptr) return device_->Forward(batch, on_layer);
  const ModelConfig& c = config_;
  const size_t hidden = c.hidden_size, heads = c.num_attention_heads, nope = c.qk_nope_head_dim,
               rope = c.qk_rope_head_dim, qdim = c.q_head_dim(), kv = c.kv_lora_rank, v = c.v_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // One row per token, sequences one after another.
  struct Row {
    SequenceCache* cache;
    int64_t pos;
  };
  std::vector<Row> rows;
  for (const SequenceTokens& s : batch) {
    for (size_t i = 0; i < s.tokens.size(); ++i) rows.push_back({s.cache, s.cache->length + static_cast<int64_t>(i)});
  }
  const size_t n = rows.size();
  // Each sequence's rows take the cheaper attention form: the absorbed one
  // (decode steps, short passes over long cached prefixes) or the expanded
  // one (prefill passes). The choice depends only on the sequence itself.
  const kernels::MlaDims dims{heads, nope, rope, v, kv};
  struct Segment {
    size_t begin, end;
    bool expanded;
  };
  std::vector<Segment> segments;
  std::vector<size_t> absorbed_rows;
  std::vector<int64_t> positions(n);
  for (size_t r = 0; r < n; ++r) positions[r] = rows[r].pos;
  for (const SequenceTokens& s : batch) {
    const size_t begin = segments.empty() ? 0 : segments.back().end, count = s.tokens.size();
    const size_t before = static_cast<size_t>(s.cache->length);
    const kernels::MlaCosts cost =
        kernels::MlaFormCosts(dims, count, before + count, count * before + count * (count + 1) / 2);
    segments.push_back({begin, begin + count, cost.expanded < cost.absorbed});
    if (!segments.back().expanded) {
      for (size_t r = begin; r < begin + count; ++r) absorbed_rows.push_back(r);
    }
  }
  std::vector<float> x(n * hidden);
  {
    size_t r = 0;
    for (const SequenceTokens& s : batch) {
      for (uint32_t token : s.tokens) EmbeddingRow(embed_, token, hidden, x.data() + r++ * hidden);
    }
  }
  const size_t q_lora = c.q_lora_rank.value_or(0);
  std::vector<float> h(n * hidden), qa(n * q_lora), q(n * heads * qdim), q_latent(n * heads * kv),
      q_pe(n * heads * rope), latent(n * (kv + rope)), attn_latent(n * heads * kv), attn(n * heads * v),
      delta(n * hidden);
  auto row = [](std::vector<float>& m, size_t r, size_t width) { return std::span(m).subspan(r * width, width); };
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& l = layers_[li];
    for (size_t r = 0; r < n; ++r) {
      KVTIER_RETURN_IF_ERROR(Check(kernels::RmsNorm(row(x, r, hidden), l.input_norm, eps, row(h, r, hidden))));
    }
    if (q_lora > 0) {
      MatMul(l.q_a, q_lora, hidden, h.data(), n, qa.data());
      for (size_t r = 0; r < n; ++r) {
        KVTIER_RETURN_IF_ERROR(Check(kernels::RmsNorm(row(qa, r, q_lora), l.q_a_norm, eps, row(qa, r, q_lora))));
      }
      MatMul(l.q_b, heads * qdim, q_lora, qa.data(), n, q.data());
    } else {
      MatMul(l.q_proj, heads * qdim, hidden, h.data(), n, q.data());
    }
    MatMul(l.kv_a, kv + rope, hidden, h.data(), n, latent.data());
    for (size_t r = 0; r < n; ++r) {
      std::span<float> lat = row(latent, r, kv + rope);
      KVTIER_RETURN_IF_ERROR(Check(kernels::RmsNorm(lat.first(kv), l.kv_a_norm, eps, lat.first(kv))));
      rope_.Apply(rows[r].pos, lat.subspan(kv));
      std::vector<float>& tail = rows[r].cache->tail[li];
      tail.insert(tail.end(), lat.begin(), lat.end());
      for (size_t hd = 0; hd < heads; ++hd) {
        std::span<float> pe = row(q_pe, r * heads + hd, rope);
        std::copy_n(q.data() + (r * heads + hd) * qdim + nope, rope, pe.begin());
        rope_.Apply(rows[r].pos, pe);
      }
    }
    // Absorbed rows: W_UK folded into the query (each weight row read once
    // for all of them), attention over the stored latents, W_UV after.
    kernels::AbsorbQueries(dims, l.w_uk.data(), q.data(), absorbed_rows, q_latent.data());
    // Rows attend independently: the kernel threads take them in chunks
    // (a decode step's sequences), each keeping its own first error.
    std::vector<kernels::Status> row_status(absorbed_rows.size());
    kernels::ParallelFor(absorbed_rows.size(), 1, [&](size_t begin, size_t end) {
      for (size_t k = begin; k < end; ++k) {
        const size_t r = absorbed_rows[k];
        const SequenceCache& cache = *rows[r].cache;
        std::vector<kernels::LatentBlock> blocks;
        for (const auto& payload : cache.blocks[li]) blocks.push_back({cache.codec, cache.tokens_per_block, payload});
        // Causal: this row sees the tail up to and including its own token.
        const int64_t sealed = static_cast<int64_t>(blocks.size()) * cache.tokens_per_block;
        const size_t visible = static_cast<size_t>(rows[r].pos - sealed + 1) * (kv + rope);
        row_status[k] = kernels::AbsorbedMlaDecode(
            {static_cast<uint32_t>(heads), static_cast<uint32_t>(kv), static_cast<uint32_t>(rope)},
            row(q_latent, r, heads * kv), row(q_pe, r, heads * rope), static_cast<float>(c.SoftmaxScale()), blocks,
            std::span(cache.tail[li]).first(visible), row(attn_latent, r, heads * kv));
      }
    });
    for (const kernels::Status& st : row_status) KVTIER_RETURN_IF_ERROR(Check(st));
    for (const Segment& seg : segments) {
      const size_t count = seg.end - seg.begin;
      if (!seg.expanded) {
        for (size_t hd = 0; hd < heads; ++hd) {
          kernels::Gemm(l.w_uv.data() + hd * v * kv, v, kv, attn_latent.data() + (seg.begin * heads + hd) * kv, count,
                        heads * kv, attn.data() + seg.begin * heads * v + hd * v, heads * v);
        }
        continue;
      }
      // Expanded rows: the sequence's latents so far (sealed blocks, then
      // the tail with this pass's rows) expanded into keys and values.
      const SequenceCache& cache = *rows[seg.begin].cache;
      std::vector<float> context;
      const size_t block_values = size_t{cache.tokens_per_block} * (kv + rope);
      for (const auto& payload : cache.blocks[li]) {
        context.resize(context.size() + block_values);
        KVTIER_RETURN_IF_ERROR(Check(kernels::Dequantize(
            cache.codec, {cache.tokens_per_block, static_cast<uint32_t>(kv), static_cast<uint32_t>(rope)}, payload,
            std::span(context).last(block_values))));
      }
      context.insert(context.end(), cache.tail[li].begin(), cache.tail[li].end());
      kernels::ExpandedAttention(dims, l.w_uk.data(), l.w_uv.data(), context, count, positions.data() + seg.begin,
                                 q.data() + seg.begin * heads * qdim, q_pe.data() + seg.begin * heads * rope,
                                 static_cast<float>(c.SoftmaxScale()), attn.data() + seg.begin * heads * v);
    }
    MatMul(l.o_proj, hidden, heads * v, attn.data(), n, delta.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
    for (size_t r = 0; r < n; ++r) {
      KVTIER_RETURN_IF_ERROR(Check(kernels::RmsNorm(row(x, r, hidden), l.post_norm, eps, row(h, r, hidden))));
    }
    if (l.moe) {
      MoeForward(l.experts, hidden, h.data(), n, delta.data());
    } else {
      std::fill(delta.begin(), delta.end(), 0.0f);
      SwiGluForward(l.mlp, hidden, h.data(), n, nullptr, nullptr, delta.data());
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
    // Every row has attended at this layer: its full blocks can be sealed.
    for (const SequenceTokens& s : batch) {
      KVTIER_RETURN_IF_ERROR(SealFullBlocks(*s.cache, li, static_cast<uint32_t>(kv), static_cast<uint32_t>(rope)));
    }
    if (on_layer) on_layer(li);
  }
  // Logits after each sequence's last token.
  std::vector<float> last(batch.size() * hidden);
  size_t end = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    end += batch[b].tokens.size();
    KVTIER_RETURN_IF_ERROR(Check(kernels::RmsNorm(row(x, end - 1, hidden), final_norm_, eps, row(last, b, hidden))));
  }
  // Straight into the callers' logits when they are one buffer, row after
  // row (the decode batcher's), else through one of our own.
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  bool one_buffer = true;
  for (size_t b = 0; b < batch.size(); ++b) one_buffer &= batch[b].logits.data() == batch[0].logits.data() + b * vocab;
  std::vector<float> own(one_buffer ? 0 : batch.size() * vocab);
  float* logits = one_buffer ? batch[0].logits.data() : own.data();
  MatMul(lm_head_, c.vocab_size, hidden, last.data(), batch.size(), logits);
  for (size_t b = 0; b < batch.size(); ++b) {
    if (!one_buffer) std::copy_n(own.begin() + b * vocab, vocab, batch[b].logits.begin());
    batch[b].cache->length += static_cast<int64_t>(batch[b].tokens.size());
  }
  return absl::OkStatus();
}

KvBWeights SplitKvB(std::span<const float> kv_b, const ModelConfig& c) {
  const size_t heads = c.num_attention_heads, nope = c.qk_nope_head_dim, v = c.v_head_dim, kv = c.kv_lora_rank;
  KvBWeights w{std::vector<float>(heads * nope * kv), std::vector<float>(heads * v * kv)};
  // Per head: nope rows of W_UK, then v rows of W_UV.
  for (size_t h = 0; h < heads; ++h) {
    const float* head = kv_b.data() + h * (nope + v) * kv;
    std::copy_n(head, nope * kv, w.w_uk.data() + h * nope * kv);
    std::copy_n(head + nope * kv, v * kv, w.w_uv.data() + h * v * kv);
  }
  return w;
}

absl::Status SealFullBlocks(SequenceCache& cache, size_t li, uint32_t kv_lora_rank, uint32_t rope_dim) {
  const kernels::BlockShape shape{cache.tokens_per_block, kv_lora_rank, rope_dim};
  std::vector<float>& tail = cache.tail[li];
  size_t sealed = 0;
  while (tail.size() - sealed >= shape.values()) {
    if (cache.sealed_rows != nullptr) {
      if (cache.sealed_rows->size() <= li) cache.sealed_rows->resize(li + 1);
      (*cache.sealed_rows)[li].insert((*cache.sealed_rows)[li].end(), tail.begin() + static_cast<ptrdiff_t>(sealed),
                                      tail.begin() + static_cast<ptrdiff_t>(sealed + shape.values()));
    }
    std::vector<uint8_t> payload(kernels::EncodedBytes(cache.codec, shape));
    KVTIER_RETURN_IF_ERROR(Check(
        kernels::Quantize(cache.codec, shape, std::span<const float>(tail).subspan(sealed, shape.values()), payload)));
    cache.blocks[li].push_back(std::move(payload));
    sealed += shape.values();
  }
  tail.erase(tail.begin(), tail.begin() + static_cast<ptrdiff_t>(sealed));
  return absl::OkStatus();
}

}  // namespace kvtier::runtime
