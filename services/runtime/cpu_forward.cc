#include "services/runtime/cpu_forward.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/kernels/expanded_attention.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/mla_attention.h"
#include "kvtier/kernels/parallel.h"
#include "services/base/status.h"
#include "services/runtime/ffn.h"
#include "services/runtime/matmul.h"
#include "services/runtime/model_weights.h"
#include "services/runtime/sparse_attention.h"

namespace kvtier::runtime {
namespace {

absl::Status Check(const kernels::Status& s) { return FromKernelStatus(s); }

class CpuForward final : public ForwardBackend {
 public:
  CpuForward(const ModelConfig& config, const kernels::RopeTable& rope) : config_(config), rope_(rope) {}

  absl::Status Load(const Checkpoint& checkpoint);
  absl::Status Forward(std::span<const SequenceTokens> batch,
                       const std::function<void(size_t layer)>& on_layer) override;

 private:
  struct Layer {
    std::vector<float> input_norm, post_norm, q_a_norm, kv_a_norm;
    WeightMatrix q_proj;    // [heads*q_head, hidden] (no q_lora)
    WeightMatrix q_a, q_b;  // q_lora form
    WeightMatrix kv_a;
    std::vector<float> w_uk, w_uv;  // [heads][nope][kv], [heads][v][kv]
    WeightMatrix o_proj;
    std::optional<IndexerWeights> indexer;  // V3.2
    bool moe = false;
    SwiGluWeights mlp;  // dense layers
    MoeWeights experts;
  };

  const ModelConfig config_;
  const kernels::RopeTable rope_;
  std::vector<float> final_norm_;
  WeightMatrix embed_, lm_head_;
  std::vector<Layer> layers_;
};

absl::Status CpuForward::Load(const Checkpoint& ckpt) {
  const ModelConfig& c = config_;
  auto load_swiglu = [&](const MlpTensors& t) -> absl::StatusOr<SwiGluWeights> {
    SwiGluWeights w;
    w.inter = static_cast<size_t>(t.inter);
    KVTIER_ASSIGN_OR_RETURN(w.gate, LoadMatrix(ckpt, t.gate));
    KVTIER_ASSIGN_OR_RETURN(w.up, LoadMatrix(ckpt, t.up));
    KVTIER_ASSIGN_OR_RETURN(w.down, LoadMatrix(ckpt, t.down));
    return w;
  };
  const GlobalTensors global = GlobalTensorsOf(c);
  KVTIER_ASSIGN_OR_RETURN(embed_, LoadMatrix(ckpt, global.embed));
  KVTIER_ASSIGN_OR_RETURN(final_norm_, LoadFloats(ckpt, global.final_norm));
  KVTIER_ASSIGN_OR_RETURN(lm_head_, LoadMatrix(ckpt, global.lm_head));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const LayerTensors t = LayerTensorsOf(c, i);
    Layer l;
    KVTIER_ASSIGN_OR_RETURN(l.input_norm, LoadFloats(ckpt, t.input_norm));
    KVTIER_ASSIGN_OR_RETURN(l.post_norm, LoadFloats(ckpt, t.post_norm));
    if (t.q_a.has_value()) {
      KVTIER_ASSIGN_OR_RETURN(l.q_a, LoadMatrix(ckpt, *t.q_a));
      KVTIER_ASSIGN_OR_RETURN(l.q_a_norm, LoadFloats(ckpt, *t.q_a_norm));
      KVTIER_ASSIGN_OR_RETURN(l.q_b, LoadMatrix(ckpt, *t.q_b));
    } else {
      KVTIER_ASSIGN_OR_RETURN(l.q_proj, LoadMatrix(ckpt, *t.q_proj));
    }
    KVTIER_ASSIGN_OR_RETURN(l.kv_a, LoadMatrix(ckpt, t.kv_a));
    KVTIER_ASSIGN_OR_RETURN(l.kv_a_norm, LoadFloats(ckpt, t.kv_a_norm));
    KVTIER_ASSIGN_OR_RETURN(std::vector<float> kv_b, LoadFloats(ckpt, t.kv_b));
    KvBWeights split = SplitKvB(kv_b, c);
    l.w_uk = std::move(split.w_uk);
    l.w_uv = std::move(split.w_uv);
    KVTIER_ASSIGN_OR_RETURN(l.o_proj, LoadMatrix(ckpt, t.o_proj));
    if (t.indexer.has_value()) {
      IndexerWeights& ix = l.indexer.emplace();
      KVTIER_ASSIGN_OR_RETURN(ix.wq_b, LoadMatrix(ckpt, t.indexer->wq_b));
      KVTIER_ASSIGN_OR_RETURN(ix.wk, LoadMatrix(ckpt, t.indexer->wk));
      KVTIER_ASSIGN_OR_RETURN(ix.k_norm, LoadFloats(ckpt, t.indexer->k_norm));
      KVTIER_ASSIGN_OR_RETURN(ix.k_norm_bias, LoadFloats(ckpt, t.indexer->k_norm_bias));
      KVTIER_ASSIGN_OR_RETURN(ix.weights_proj, LoadFloats(ckpt, t.indexer->weights_proj));
    }
    l.moe = t.moe;
    if (!l.moe) {
      KVTIER_ASSIGN_OR_RETURN(l.mlp, load_swiglu(*t.mlp));
    } else {
      MoeWeights& moe = l.experts;
      KVTIER_ASSIGN_OR_RETURN(moe.router, LoadFloats(ckpt, *t.router));
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        KVTIER_ASSIGN_OR_RETURN(SwiGluWeights expert, load_swiglu(ExpertTensors(c, i, e)));
        moe.experts.push_back(std::move(expert));
      }
      if (t.shared.has_value()) {
        KVTIER_ASSIGN_OR_RETURN(moe.shared, load_swiglu(*t.shared));
      }
      moe.gate = c.Gate();
      if (t.correction_bias.has_value()) {
        KVTIER_ASSIGN_OR_RETURN(moe.correction_bias, LoadFloats(ckpt, *t.correction_bias));
        moe.gate.correction_bias = moe.correction_bias;  // its buffer moves with the layer
      }
    }
    layers_.push_back(std::move(l));
  }
  return absl::OkStatus();
}

absl::Status CpuForward::Forward(std::span<const SequenceTokens> batch,
                                 const std::function<void(size_t layer)>& on_layer) {
  const ModelConfig& c = config_;
  const size_t hidden = c.hidden_size, heads = c.num_attention_heads, nope = c.qk_nope_head_dim,
               rope = c.qk_rope_head_dim, qdim = c.q_head_dim(), kv = c.kv_lora_rank, v = c.v_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const std::vector<PassRow> rows = PassRows(batch);
  const size_t n = rows.size();
  // Each sequence's rows take the cheaper attention form: the absorbed one
  // (decode steps, short passes over long cached prefixes) or the expanded
  // one (prefill passes). The choice depends only on the sequence itself.
  // Under V3.2's sparse attention a sequence that reaches past index_topk
  // tokens takes the absorbed form, over the tokens its indexer chose.
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
    const bool sparse = c.indexer.has_value() && before + count > static_cast<size_t>(c.indexer->topk);
    segments.push_back({begin, begin + count, cost.expanded < cost.absorbed && !sparse});
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
    std::vector<std::vector<uint32_t>> selected(n);  // V3.2: the tokens a row attends to (empty: all)
    if (l.indexer.has_value()) {
      KVTIER_RETURN_IF_ERROR(IndexRows(c, rope_, *l.indexer, li, rows, h.data(), qa.data(), selected));
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
        const kernels::MlaShape shape{static_cast<uint32_t>(heads), static_cast<uint32_t>(kv),
                                      static_cast<uint32_t>(rope)};
        if (!selected[r].empty()) {
          // The chosen tokens' latents as float rows, in a buffer kept per
          // thread (index_topk rows, for every layer of every step).
          thread_local std::vector<float> chosen;
          const absl::Status gathered =
              GatherLatents(cache, li, selected[r], static_cast<uint32_t>(kv), static_cast<uint32_t>(rope), chosen);
          row_status[k] = gathered.ok()
                              ? kernels::AbsorbedMlaDecode(
                                    shape, row(q_latent, r, heads * kv), row(q_pe, r, heads * rope),
                                    static_cast<float>(c.SoftmaxScale()), {}, chosen, row(attn_latent, r, heads * kv))
                              : kernels::InvalidArgument(std::string(gathered.message()));
          continue;
        }
        std::vector<kernels::LatentBlock> blocks;
        for (const auto& payload : cache.blocks[li]) blocks.push_back({cache.codec, cache.tokens_per_block, payload});
        // Causal: this row sees the tail up to and including its own token.
        const int64_t sealed = static_cast<int64_t>(blocks.size()) * cache.tokens_per_block;
        const size_t visible = static_cast<size_t>(rows[r].pos - sealed + 1) * (kv + rope);
        row_status[k] = kernels::AbsorbedMlaDecode(
            shape, row(q_latent, r, heads * kv), row(q_pe, r, heads * rope), static_cast<float>(c.SoftmaxScale()),
            blocks, std::span(cache.tail[li]).first(visible), row(attn_latent, r, heads * kv));
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

}  // namespace

absl::StatusOr<std::unique_ptr<ForwardBackend>> LoadCpuForward(const Checkpoint& checkpoint,
                                                               const kernels::RopeTable& rope) {
  auto forward = std::make_unique<CpuForward>(checkpoint.config(), rope);
  KVTIER_RETURN_IF_ERROR(forward->Load(checkpoint));
  return forward;
}

}  // namespace kvtier::runtime
