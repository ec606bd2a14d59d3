#include "services/runtime/v4_forward.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/indexer.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/parallel.h"
#include "kvtier/kernels/qat_rounding.h"
#include "kvtier/kernels/rope.h"
#include "services/base/status.h"
#include "services/runtime/accelerator.h"
#include "services/runtime/ffn.h"
#include "services/runtime/hyper_connections.h"
#include "services/runtime/matmul.h"
#include "services/runtime/model_weights.h"
#include "services/runtime/v4_tensors.h"

namespace kvtier::runtime {
namespace {

absl::Status Check(const kernels::Status& s) { return FromKernelStatus(s); }

// The model's FP8 rounding of an entry's non-rotated dims: blocks of 64.
constexpr size_t kEntryFp8Block = 64;
// Its FP4 rounding of indexer queries and keys: blocks of 32.
constexpr size_t kIndexFp4Block = 32;

// An attention entry as the model keeps it: FP8 on the non-rotated dims,
// bf16 on the rotated ones (its cache is bf16; FlashMLA's entry format
// stores them so).
void RoundEntry(std::span<float> entry, size_t rope_dim) {
  kernels::RoundThroughFp8(entry.first(entry.size() - rope_dim), kEntryFp8Block);
  for (float& v : entry.last(rope_dim)) v = kernels::Bf16ToFloat(kernels::FloatToBf16(v));
}

// A compressor: each group of `ratio` tokens becomes one entry of `dim`
// values, a softmax-weighted sum of the tokens' kv rows per dim (scores
// from wgate plus a position embedding). At ratio 4 groups overlap: an
// entry pools the previous group's first halves and its own second halves.
struct Compressor {
  size_t ratio = 0, dim = 0;
  std::vector<float> ape;  // [ratio][width]
  WeightMatrix wkv, wgate;
  std::vector<float> norm;
  bool overlap() const { return ratio == 4; }
  size_t width() const { return (overlap() ? 2 : 1) * dim; }
};

struct Indexer {
  WeightMatrix wq_b, weights_proj;
  Compressor compressor;
};

struct Layer {
  HcParams hc_attn, hc_ffn;
  std::vector<float> attn_norm, ffn_norm, attn_sink, q_norm, kv_norm;
  WeightMatrix wq_a, wq_b, wkv, wo_a, wo_b;
  const kernels::RopeTable* rope = nullptr;  // window-only or compressed layers' table
  std::optional<Compressor> compressor;
  std::optional<Indexer> indexer;
  std::vector<float> gate, gate_bias;  // router [experts][hidden]; bias of score-routed layers
  std::vector<uint32_t> tid2eid;       // hash-routed layers: [vocab][experts_per_tok]
  MoeWeights moe;                      // experts and the shared expert (router unused)
};

class V4Forward final : public ForwardBackend {
 public:
  V4Forward(const ModelConfig& config, std::unique_ptr<Accelerator> device)
      : device_(std::move(device)), c_(config), v4_(*config.v4) {}

  absl::Status Load(const Checkpoint& checkpoint);
  absl::Status Forward(std::span<const SequenceTokens> batch,
                       const std::function<void(size_t layer)>& on_layer) override;

 private:
  struct Row {
    SequenceCache* cache;
    int64_t pos;
    uint32_t token;
  };
  absl::StatusOr<Compressor> LoadCompressor(const Checkpoint& ckpt, const V4CompressorTensors& t, size_t ratio,
                                            size_t dim) const;
  // Attention of rows (sequences one after another, positions in order)
  // from their inputs h [n][hidden] into out [n][hidden].
  absl::Status Attention(size_t li, std::span<const Row> rows, std::span<const size_t> sequence_starts, const float* h,
                         float* out) const;
  // A layer's products of a pass's rows: query latents and queries, window
  // entries (rotated and rounded), the compressors' rows, the indexer's
  // queries and head weights.
  struct Projected {
    std::vector<float> qr, q, kv, ckv, cscore, ikv, iscore, iq, iw;
  };
  absl::StatusOr<Projected> Project(const Layer& l, std::span<const Row> rows, const float* h) const;
  // What a row sees, gathered in steps: its window's entries (oldest
  // first) as it advanced, how many compressed entries and indexer keys
  // its sequence had then, and the compressed entries it chose.
  struct Seen {
    std::vector<float> entries;
    size_t compressed = 0, keys = 0;
    std::vector<uint32_t> chosen;
  };
  // Advances row r's sequence by its position at layer li (window,
  // compressors) and notes what the row sees.
  absl::Status AdvanceRow(size_t li, const Projected& p, size_t r, const Row& row, Seen& a) const;
  // The compressed entries each row attends: on CSA layers the indexer's
  // top-k of those closed so far, on HCA layers all of them.
  absl::Status Choose(size_t li, const Projected& p, std::span<const Row> rows, std::vector<Seen>& seen) const;
  // The MoE half: out[n][hidden].
  void Ffn(const Layer& l, std::span<const Row> rows, const float* h, float* out) const;
  // Moves the projections, experts and head to device_ (the embedding,
  // router and norms stay: they are read a row at a time or are small).
  absl::Status PlaceOnDevice();
  // The first failure of a product on device_ since the last call.
  absl::Status DeviceError() const { return device_ != nullptr ? device_->TakeError() : absl::OkStatus(); }
  HcShape Hc() const {
    return {static_cast<size_t>(v4_.hc_mult), static_cast<size_t>(c_.hidden_size), static_cast<float>(c_.rms_norm_eps),
            static_cast<float>(v4_.hc_eps), static_cast<int>(v4_.hc_sinkhorn_iters)};
  }

  // The accelerator its products, indexer and attention run on (null: the
  // CPU); declared first, so that the matrices placed there go before it.
  const std::unique_ptr<Accelerator> device_;
  // With an accelerator, one pass at a time (as CudaForward's), so that
  // the failure TakeError reports is the pass's own.
  std::mutex device_pass_;
  const ModelConfig c_;
  const V4Config v4_;
  kernels::RopeTable window_rope_, compressed_rope_;
  WeightMatrix embed_, head_;
  std::vector<float> norm_;
  HcParams hc_head_;
  std::vector<Layer> layers_;
};

// A projection whose products round their inputs when it is FP8 or FP4
// (MatMulRoundingInputs), which needs inputs of whole blocks of 128.
absl::StatusOr<WeightMatrix> LoadRounding(const Checkpoint& ckpt, const TensorSpec& spec) {
  KVTIER_ASSIGN_OR_RETURN(WeightMatrix w, LoadMatrix(ckpt, spec));
  const int64_t cols = spec.shape[1] * (spec.dtype == DType::kI8 ? 2 : 1);
  if (w.quantized() && cols % 128 != 0) {
    return absl::UnimplementedError(absl::StrCat("tensor ", spec.name, ": an FP8/FP4 projection's input (", cols,
                                                 ") must be whole blocks of 128, as DeepSeek-V4's GEMMs take them"));
  }
  return w;
}

// wo_a: published in FP8, but the model multiplies it in bf16, its inputs
// not rounded (model.py's einsum over the dequantized weights, which bf16
// holds exactly).
absl::StatusOr<WeightMatrix> LoadWidened(const Checkpoint& ckpt, const TensorSpec& spec) {
  KVTIER_ASSIGN_OR_RETURN(const TensorView t, ckpt.Tensor(spec.name));
  if (t.dtype != DType::kF8E4m3) return LoadMatrix(ckpt, spec);
  KVTIER_ASSIGN_OR_RETURN(const std::vector<float> values, LoadFloats(ckpt, spec));
  WeightMatrix widened;
  for (float v : values) widened.bf16.push_back(kernels::FloatToBf16(v));
  return widened;
}

absl::StatusOr<HcParams> LoadHc(const Checkpoint& ckpt, const V4HcTensors& t) {
  HcParams p;
  KVTIER_ASSIGN_OR_RETURN(p.fn, LoadFloats(ckpt, t.fn));
  KVTIER_ASSIGN_OR_RETURN(p.base, LoadFloats(ckpt, t.base));
  KVTIER_ASSIGN_OR_RETURN(p.scale, LoadFloats(ckpt, t.scale));
  return p;
}

absl::StatusOr<Compressor> V4Forward::LoadCompressor(const Checkpoint& ckpt, const V4CompressorTensors& t, size_t ratio,
                                                     size_t dim) const {
  Compressor k;
  k.ratio = ratio;
  k.dim = dim;
  KVTIER_ASSIGN_OR_RETURN(k.ape, LoadFloats(ckpt, t.ape));
  KVTIER_ASSIGN_OR_RETURN(k.wkv, LoadMatrix(ckpt, t.wkv));
  KVTIER_ASSIGN_OR_RETURN(k.wgate, LoadMatrix(ckpt, t.wgate));
  KVTIER_ASSIGN_OR_RETURN(k.norm, LoadFloats(ckpt, t.norm));
  return k;
}

absl::Status V4Forward::Load(const Checkpoint& ckpt) {
  const uint32_t rope_dim = static_cast<uint32_t>(c_.qk_rope_head_dim);
  KVTIER_RETURN_IF_ERROR(Check(kernels::RopeTable::Create(rope_dim, c_.rope_theta, nullptr, window_rope_)));
  // Compressed layers: YaRN's frequencies without its magnitude scaling
  // (model.py's precompute_freqs_cis has none; equal mscales cancel).
  std::optional<kernels::YarnParams> yarn = c_.rope_scaling;
  if (yarn.has_value()) yarn->mscale = yarn->mscale_all_dim = 1.0;
  KVTIER_RETURN_IF_ERROR(Check(kernels::RopeTable::Create(rope_dim, v4_.compress_rope_theta,
                                                          yarn.has_value() ? &*yarn : nullptr, compressed_rope_)));
  const V4GlobalTensors g = V4GlobalTensorsOf(c_);
  KVTIER_ASSIGN_OR_RETURN(embed_, LoadMatrix(ckpt, g.embed));
  KVTIER_ASSIGN_OR_RETURN(head_, LoadMatrix(ckpt, g.head));
  KVTIER_ASSIGN_OR_RETURN(norm_, LoadFloats(ckpt, g.norm));
  KVTIER_ASSIGN_OR_RETURN(hc_head_, LoadHc(ckpt, g.hc_head));
  auto load_swiglu = [&](const MlpTensors& t) -> absl::StatusOr<SwiGluWeights> {
    SwiGluWeights w;
    w.inter = static_cast<size_t>(t.inter);
    w.limit = static_cast<float>(v4_.swiglu_limit);
    w.weight_before_down = true;
    w.round_inputs = true;  // over FP8 or FP4 weights only (MatMulRoundingInputs)
    KVTIER_ASSIGN_OR_RETURN(w.gate, LoadRounding(ckpt, t.gate));
    KVTIER_ASSIGN_OR_RETURN(w.up, LoadRounding(ckpt, t.up));
    KVTIER_ASSIGN_OR_RETURN(w.down, LoadRounding(ckpt, t.down));
    return w;
  };
  for (int64_t i = 0; i < c_.num_hidden_layers; ++i) {
    const V4LayerTensors t = V4LayerTensorsOf(c_, i);
    Layer l;
    KVTIER_ASSIGN_OR_RETURN(l.hc_attn, LoadHc(ckpt, t.hc_attn));
    KVTIER_ASSIGN_OR_RETURN(l.hc_ffn, LoadHc(ckpt, t.hc_ffn));
    KVTIER_ASSIGN_OR_RETURN(l.attn_norm, LoadFloats(ckpt, t.attn_norm));
    KVTIER_ASSIGN_OR_RETURN(l.ffn_norm, LoadFloats(ckpt, t.ffn_norm));
    KVTIER_ASSIGN_OR_RETURN(l.attn_sink, LoadFloats(ckpt, t.attn_sink));
    KVTIER_ASSIGN_OR_RETURN(l.q_norm, LoadFloats(ckpt, t.q_norm));
    KVTIER_ASSIGN_OR_RETURN(l.kv_norm, LoadFloats(ckpt, t.kv_norm));
    KVTIER_ASSIGN_OR_RETURN(l.wq_a, LoadRounding(ckpt, t.wq_a));
    KVTIER_ASSIGN_OR_RETURN(l.wq_b, LoadRounding(ckpt, t.wq_b));
    KVTIER_ASSIGN_OR_RETURN(l.wkv, LoadRounding(ckpt, t.wkv));
    KVTIER_ASSIGN_OR_RETURN(l.wo_a, LoadWidened(ckpt, t.wo_a));
    KVTIER_ASSIGN_OR_RETURN(l.wo_b, LoadRounding(ckpt, t.wo_b));
    const size_t ratio = static_cast<size_t>(v4_.compress_ratios[static_cast<size_t>(i)]);
    l.rope = ratio > 0 ? &compressed_rope_ : &window_rope_;
    if (t.compressor.has_value()) {
      KVTIER_ASSIGN_OR_RETURN(l.compressor, LoadCompressor(ckpt, *t.compressor, ratio, v4_.head_dim));
    }
    if (t.indexer.has_value()) {
      Indexer& ix = l.indexer.emplace();
      KVTIER_ASSIGN_OR_RETURN(ix.wq_b, LoadRounding(ckpt, t.indexer->wq_b));
      KVTIER_ASSIGN_OR_RETURN(ix.weights_proj, LoadMatrix(ckpt, t.indexer->weights_proj));
      KVTIER_ASSIGN_OR_RETURN(ix.compressor, LoadCompressor(ckpt, t.indexer->compressor, ratio, c_.indexer->head_dim));
    }
    KVTIER_ASSIGN_OR_RETURN(l.gate, LoadFloats(ckpt, t.gate));
    if (t.gate_bias.has_value()) {
      KVTIER_ASSIGN_OR_RETURN(l.gate_bias, LoadFloats(ckpt, *t.gate_bias));
    }
    if (t.tid2eid.has_value()) {
      KVTIER_ASSIGN_OR_RETURN(const std::vector<float> ids, LoadFloats(ckpt, *t.tid2eid));
      for (float id : ids) {
        if (!(id >= 0 && id < static_cast<float>(c_.n_routed_experts)) || id != std::floor(id)) {
          return absl::InvalidArgumentError(absl::StrCat("tensor ", t.tid2eid->name, " holds ", id,
                                                         ", not an expert id below ", c_.n_routed_experts));
        }
        l.tid2eid.push_back(static_cast<uint32_t>(id));
      }
    }
    for (int64_t e = 0; e < c_.n_routed_experts; ++e) {
      KVTIER_ASSIGN_OR_RETURN(SwiGluWeights expert, load_swiglu(V4ExpertTensors(c_, i, e)));
      l.moe.experts.push_back(std::move(expert));
    }
    KVTIER_ASSIGN_OR_RETURN(l.moe.shared, load_swiglu(t.shared));
    layers_.push_back(std::move(l));
  }
  return device_ != nullptr ? PlaceOnDevice() : absl::OkStatus();
}

absl::Status V4Forward::PlaceOnDevice() {
  const size_t hidden = c_.hidden_size, q_lora = *c_.q_lora_rank;
  const size_t group_width = c_.num_attention_heads * v4_.head_dim / v4_.o_groups;
  const auto place_mlp = [&](SwiGluWeights& w) -> absl::Status {
    if (w.inter == 0) return absl::OkStatus();
    KVTIER_RETURN_IF_ERROR(device_->Place(w.gate, hidden));
    KVTIER_RETURN_IF_ERROR(device_->Place(w.up, hidden));
    return device_->Place(w.down, w.inter);
  };
  const auto place_compressor = [&](Compressor& k) -> absl::Status {
    KVTIER_RETURN_IF_ERROR(device_->Place(k.wkv, hidden));
    return device_->Place(k.wgate, hidden);
  };
  KVTIER_RETURN_IF_ERROR(device_->Place(head_, hidden));
  for (Layer& l : layers_) {
    KVTIER_RETURN_IF_ERROR(device_->Place(l.wq_a, hidden));
    KVTIER_RETURN_IF_ERROR(device_->Place(l.wq_b, q_lora));
    KVTIER_RETURN_IF_ERROR(device_->Place(l.wkv, hidden));
    KVTIER_RETURN_IF_ERROR(device_->Place(l.wo_a, group_width));
    KVTIER_RETURN_IF_ERROR(device_->Place(l.wo_b, v4_.o_groups * v4_.o_lora_rank));
    if (l.compressor.has_value()) KVTIER_RETURN_IF_ERROR(place_compressor(*l.compressor));
    if (l.indexer.has_value()) {
      KVTIER_RETURN_IF_ERROR(device_->Place(l.indexer->wq_b, q_lora));
      KVTIER_RETURN_IF_ERROR(device_->Place(l.indexer->weights_proj, hidden));
      KVTIER_RETURN_IF_ERROR(place_compressor(l.indexer->compressor));
    }
    for (SwiGluWeights& expert : l.moe.experts) KVTIER_RETURN_IF_ERROR(place_mlp(expert));
    KVTIER_RETURN_IF_ERROR(place_mlp(l.moe.shared));
  }
  return absl::OkStatus();
}

absl::Status RmsNormRows(float* x, size_t n, size_t width, std::span<const float> weight, float eps) {
  for (size_t r = 0; r < n; ++r) {
    const std::span<float> row(x + r * width, width);
    KVTIER_RETURN_IF_ERROR(Check(kernels::RmsNorm(row, weight, eps, row)));
  }
  return absl::OkStatus();
}

// Appends one token's compressor rows (kv, score without the position
// embedding) at position `pos`; when that closes a group, appends the
// group's entry to `entries`: pooled, normed, rotated at the group's first
// position, then rounded as the model rounds it (`index`: Hadamard and FP4;
// else RoundEntry).
absl::Status CompressStep(const Compressor& k, V4CompressorState& s, const float* kv, const float* score, int64_t pos,
                          const kernels::RopeTable& rope, float eps, bool index, std::vector<float>& entries) {
  const size_t width = k.width(), d = k.dim, ratio = k.ratio;
  const float* ape = k.ape.data() + static_cast<size_t>(pos % static_cast<int64_t>(ratio)) * width;
  s.kv.insert(s.kv.end(), kv, kv + width);
  for (size_t i = 0; i < width; ++i) s.score.push_back(score[i] + ape[i]);
  if ((pos + 1) % static_cast<int64_t>(ratio) != 0) return absl::OkStatus();
  if (s.kv.size() != ratio * width) {
    return absl::InternalError("a compressor's open group does not hold its tokens (state restored at a wrong place)");
  }
  std::vector<float> entry(d), weights;
  std::vector<const float*> values;
  for (size_t i = 0; i < d; ++i) {
    // The rows pooled at dim i: the previous group's first halves (when
    // groups overlap and one closed before), then this group's (second
    // halves when overlapping).
    weights.clear();
    values.clear();
    const size_t own = k.overlap() ? d + i : i;
    if (k.overlap() && !s.previous_kv.empty()) {
      for (size_t r = 0; r < ratio; ++r) {
        weights.push_back(s.previous_score[r * d + i]);
        values.push_back(&s.previous_kv[r * d + i]);
      }
    }
    for (size_t r = 0; r < ratio; ++r) {
      weights.push_back(s.score[r * width + own]);
      values.push_back(&s.kv[r * width + own]);
    }
    kernels::Softmax(weights.data(), weights.size());
    float sum = 0;
    for (size_t r = 0; r < weights.size(); ++r) sum += weights[r] * *values[r];
    entry[i] = sum;
  }
  KVTIER_RETURN_IF_ERROR(Check(kernels::RmsNorm(entry, k.norm, eps, entry)));
  const size_t rope_dim = rope.dim();
  rope.ApplyPairs(pos + 1 - static_cast<int64_t>(ratio), std::span(entry).last(rope_dim));
  if (index) {
    KVTIER_RETURN_IF_ERROR(Check(kernels::HadamardRotate(entry)));
    kernels::RoundThroughFp4(entry, kIndexFp4Block);
  } else {
    RoundEntry(entry, rope_dim);
  }
  entries.insert(entries.end(), entry.begin(), entry.end());
  if (k.overlap()) {  // the next entry pools these rows' first halves
    s.previous_kv.resize(ratio * d);
    s.previous_score.resize(ratio * d);
    for (size_t r = 0; r < ratio; ++r) {
      std::copy_n(s.kv.begin() + r * width, d, s.previous_kv.begin() + r * d);
      std::copy_n(s.score.begin() + r * width, d, s.previous_score.begin() + r * d);
    }
  }
  s.kv.clear();
  s.score.clear();
  return absl::OkStatus();
}

// Notes position `pos`'s window entry, indexer query and chosen entries at
// layer li.
void Record(size_t li, int64_t pos, std::span<const float> entry, std::span<const float> query,
            const std::vector<uint32_t>& chosen, V4Trace& trace) {
  const size_t p = static_cast<size_t>(pos);
  const auto slot = [&](auto& part) -> auto& {
    if (part.size() <= li) part.resize(li + 1);
    if (part[li].size() <= p) part[li].resize(p + 1);
    return part[li][p];
  };
  slot(trace.window).assign(entry.begin(), entry.end());
  slot(trace.index_query).assign(query.begin(), query.end());
  auto& attended = slot(trace.chosen);
  attended = chosen;
  std::sort(attended.begin(), attended.end());
}

absl::StatusOr<V4Forward::Projected> V4Forward::Project(const Layer& l, std::span<const Row> rows,
                                                        const float* h) const {
  const size_t n = rows.size(), hidden = c_.hidden_size, heads = c_.num_attention_heads, hd = v4_.head_dim;
  const size_t q_lora = *c_.q_lora_rank, rope_dim = c_.qk_rope_head_dim;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  Projected p;
  p.qr.resize(n * q_lora);
  p.q.resize(n * heads * hd);
  p.kv.resize(n * hd);
  MatMulRoundingInputs(l.wq_a, q_lora, hidden, h, n, p.qr.data());
  KVTIER_RETURN_IF_ERROR(RmsNormRows(p.qr.data(), n, q_lora, l.q_norm, eps));
  MatMulRoundingInputs(l.wq_b, heads * hd, q_lora, p.qr.data(), n, p.q.data());
  const std::vector<float> ones(hd, 1.0f);  // each head's RMS norm has no weight
  KVTIER_RETURN_IF_ERROR(RmsNormRows(p.q.data(), n * heads, hd, ones, eps));
  MatMulRoundingInputs(l.wkv, hd, hidden, h, n, p.kv.data());
  KVTIER_RETURN_IF_ERROR(RmsNormRows(p.kv.data(), n, hd, l.kv_norm, eps));
  for (size_t r = 0; r < n; ++r) {
    for (size_t hh = 0; hh < heads; ++hh) {
      l.rope->ApplyPairs(rows[r].pos, std::span(p.q).subspan((r * heads + hh) * hd + hd - rope_dim, rope_dim));
    }
    const std::span<float> entry = std::span(p.kv).subspan(r * hd, hd);
    l.rope->ApplyPairs(rows[r].pos, entry.last(rope_dim));
    RoundEntry(entry, rope_dim);
  }
  const auto compressor_rows = [&](const Compressor& k, std::vector<float>& kv, std::vector<float>& score) {
    kv.resize(n * k.width());
    score.resize(n * k.width());
    MatMul(k.wkv, k.width(), hidden, h, n, kv.data());
    MatMul(k.wgate, k.width(), hidden, h, n, score.data());
  };
  if (l.compressor.has_value()) compressor_rows(*l.compressor, p.ckv, p.cscore);
  if (!l.indexer.has_value()) return p;
  compressor_rows(l.indexer->compressor, p.ikv, p.iscore);
  const size_t ih = c_.indexer->heads, ihd = c_.indexer->head_dim;
  p.iq.resize(n * ih * ihd);
  p.iw.resize(n * ih);
  MatMulRoundingInputs(l.indexer->wq_b, ih * ihd, q_lora, p.qr.data(), n, p.iq.data());
  MatMul(l.indexer->weights_proj, ih, hidden, h, n, p.iw.data());
  const float weight_scale = 1.0f / std::sqrt(static_cast<float>(ihd)) / std::sqrt(static_cast<float>(ih));
  for (size_t r = 0; r < n; ++r) {
    for (size_t hh = 0; hh < ih; ++hh) {
      const std::span<float> head = std::span(p.iq).subspan((r * ih + hh) * ihd, ihd);
      l.rope->ApplyPairs(rows[r].pos, head.last(rope_dim));
      KVTIER_RETURN_IF_ERROR(Check(kernels::HadamardRotate(head)));
      kernels::RoundThroughFp4(head, kIndexFp4Block);
      p.iw[r * ih + hh] *= weight_scale;
    }
  }
  return p;
}

absl::Status V4Forward::AdvanceRow(size_t li, const Projected& p, size_t r, const Row& row, Seen& a) const {
  const Layer& l = layers_[li];
  const size_t hd = v4_.head_dim;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  V4LayerState& st = row.cache->v4[li];
  const int64_t pos = row.pos, window = v4_.sliding_window;
  std::copy_n(p.kv.data() + r * hd, hd, st.window.data() + static_cast<size_t>(pos % window) * hd);
  if (l.compressor.has_value()) {
    const size_t w = l.compressor->width();
    KVTIER_RETURN_IF_ERROR(CompressStep(*l.compressor, st.compressor, p.ckv.data() + r * w, p.cscore.data() + r * w,
                                        pos, *l.rope, eps, /*index=*/false, st.compressed));
  }
  if (l.indexer.has_value()) {
    const size_t w = l.indexer->compressor.width();
    KVTIER_RETURN_IF_ERROR(CompressStep(l.indexer->compressor, st.index_compressor, p.ikv.data() + r * w,
                                        p.iscore.data() + r * w, pos, *l.rope, eps, /*index=*/true, st.index_keys));
    a.keys = st.index_keys.size() / c_.indexer->head_dim;
  }
  a.compressed = st.compressed.size() / hd;
  // The window now: later rows of the pass overwrite its slots.
  a.entries.clear();
  for (int64_t q = std::max<int64_t>(0, pos - window + 1); q <= pos; ++q) {
    const float* e = st.window.data() + static_cast<size_t>(q % window) * hd;
    a.entries.insert(a.entries.end(), e, e + hd);
  }
  return absl::OkStatus();
}

absl::Status V4Forward::Choose(size_t li, const Projected& p, std::span<const Row> rows,
                               std::vector<Seen>& seen) const {
  const size_t n = rows.size();
  if (!layers_[li].indexer.has_value()) {
    for (Seen& a : seen) {
      a.chosen.resize(a.compressed);
      std::iota(a.chosen.begin(), a.chosen.end(), 0u);
    }
    return absl::OkStatus();
  }
  // Rows see their sequence's keys up to their own position; the keys
  // only grow, so each row reads the first a.keys of the pass's last.
  IndexerQueries queries;
  queries.heads = static_cast<uint32_t>(c_.indexer->heads);
  queries.dim = static_cast<uint32_t>(c_.indexer->head_dim);
  queries.k = static_cast<size_t>(c_.indexer->topk);
  queries.q = p.iq.data();
  queries.weights = p.iw.data();
  for (size_t r = 0; r < n; ++r) {
    queries.keys.push_back(rows[r].cache->v4[li].index_keys);
    queries.visible.push_back(static_cast<uint32_t>(seen[r].keys));
  }
  std::vector<std::vector<uint32_t>> chosen;
  if (device_ != nullptr) {
    KVTIER_RETURN_IF_ERROR(device_->ChooseKeys(queries, chosen));
  } else {
    ChooseKeysOnCpu(queries, chosen);
  }
  for (size_t r = 0; r < n; ++r) seen[r].chosen = std::move(chosen[r]);
  return absl::OkStatus();
}

absl::Status V4Forward::Attention(size_t li, std::span<const Row> rows, std::span<const size_t> starts, const float* h,
                                  float* out) const {
  const Layer& l = layers_[li];
  const size_t n = rows.size(), hidden = c_.hidden_size, heads = c_.num_attention_heads, hd = v4_.head_dim;
  KVTIER_ASSIGN_OR_RETURN(const Projected p, Project(l, rows, h));
  // Each sequence's rows in order: its window and compressors advance one
  // position at a time. Sequences run in parallel.
  std::vector<Seen> seen(n);
  std::vector<absl::Status> status(starts.size() - 1);
  kernels::ParallelFor(starts.size() - 1, 1, [&](size_t begin, size_t end) {
    for (size_t b = begin; b < end; ++b) {
      for (size_t r = starts[b]; r < starts[b + 1] && status[b].ok(); ++r) {
        status[b] = AdvanceRow(li, p, r, rows[r], seen[r]);
      }
    }
  });
  for (const absl::Status& s : status) KVTIER_RETURN_IF_ERROR(s);
  KVTIER_RETURN_IF_ERROR(Choose(li, p, rows, seen));
  std::vector<std::vector<float>> entries(n);
  const size_t ih = l.indexer.has_value() ? c_.indexer->heads * c_.indexer->head_dim : 0;
  for (size_t r = 0; r < n; ++r) {
    const std::vector<float>& compressed = rows[r].cache->v4[li].compressed;
    for (uint32_t g : seen[r].chosen) {
      seen[r].entries.insert(seen[r].entries.end(), compressed.begin() + g * hd, compressed.begin() + (g + 1) * hd);
    }
    entries[r] = std::move(seen[r].entries);
    if (V4Trace* trace = rows[r].cache->v4_trace; trace != nullptr) {
      Record(li, rows[r].pos, std::span(p.kv).subspan(r * hd, hd), std::span(p.iq).subspan(r * ih, ih), seen[r].chosen,
             *trace);
    }
  }
  // Then every row attends at once, and its outputs are rotated back.
  std::vector<float> attended(n * heads * hd);
  const kernels::SinkAttentionShape shape{static_cast<uint32_t>(heads), static_cast<uint32_t>(hd),
                                          1.0f / std::sqrt(static_cast<float>(hd))};
  if (device_ != nullptr) {
    KVTIER_RETURN_IF_ERROR(device_->SinkAttention(shape, entries, p.q.data(), l.attn_sink.data(), attended.data()));
  } else {
    SinkAttentionOnCpu(shape, entries, p.q.data(), l.attn_sink.data(), attended.data());
  }
  const size_t rope_dim = c_.qk_rope_head_dim;
  for (size_t r = 0; r < n; ++r) {
    for (size_t hh = 0; hh < heads; ++hh) {
      float* o = attended.data() + (r * heads + hh) * hd;
      l.rope->ApplyPairs(rows[r].pos, std::span(o + hd - rope_dim, rope_dim), /*inverse=*/true);
    }
  }
  // Grouped output projection: each group of heads through its own block
  // of wo_a, then wo_b over all groups.
  const size_t groups = v4_.o_groups, o_lora = v4_.o_lora_rank, group_width = heads * hd / groups;
  std::vector<float> low(n * groups * o_lora);
  for (size_t g = 0; g < groups; ++g) {
    MatMulRows(l.wo_a, g * o_lora, o_lora, group_width, attended.data() + g * group_width, n, heads * hd,
               low.data() + g * o_lora, groups * o_lora);
  }
  MatMulRoundingInputs(l.wo_b, hidden, groups * o_lora, low.data(), n, out);
  return absl::OkStatus();
}

void V4Forward::Ffn(const Layer& l, std::span<const Row> rows, const float* h, float* out) const {
  const size_t n = rows.size(), experts = c_.n_routed_experts, hidden = c_.hidden_size;
  const size_t k = c_.num_experts_per_tok;
  std::vector<float> logits(n * experts);
  MatMul(l.gate, experts, hidden, h, n, logits.data());
  std::vector<std::vector<kernels::ExpertChoice>> chosen(n);
  std::vector<uint32_t> order(experts);
  std::vector<float> biased(experts);
  for (size_t r = 0; r < n; ++r) {
    float* scores = logits.data() + r * experts;
    for (size_t e = 0; e < experts; ++e) {
      const float x = scores[e];  // softplus as torch computes it (linear above 20)
      scores[e] = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));
    }
    if (!l.tid2eid.empty()) {
      order.assign(l.tid2eid.begin() + rows[r].token * k, l.tid2eid.begin() + (rows[r].token + 1) * k);
    } else {
      for (size_t e = 0; e < experts; ++e) biased[e] = scores[e] + l.gate_bias[e];
      kernels::SelectTopTokens(biased, k, order);
    }
    float sum = 0;
    for (size_t i = 0; i < k; ++i) sum += scores[order[i]];
    for (size_t i = 0; i < k; ++i) {
      chosen[r].push_back({order[i], scores[order[i]] / sum * static_cast<float>(c_.routed_scaling_factor)});
    }
  }
  MoeForwardRouted(l.moe, hidden, h, n, chosen, out);
}

absl::Status V4Forward::Forward(std::span<const SequenceTokens> batch,
                                const std::function<void(size_t layer)>& on_layer) {
  const size_t hidden = c_.hidden_size, hc = v4_.hc_mult;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  std::unique_lock<std::mutex> one_pass;
  if (device_ != nullptr) one_pass = std::unique_lock(device_pass_);
  (void)DeviceError();  // an earlier pass's, had it returned for another reason first
  std::vector<Row> rows;
  std::vector<size_t> starts = {0};
  for (const SequenceTokens& s : batch) {
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      rows.push_back({s.cache, s.cache->length + static_cast<int64_t>(i), s.tokens[i]});
    }
    starts.push_back(rows.size());
  }
  const size_t n = rows.size();
  // The residual stream: hc copies of each row's hidden state.
  std::vector<float> x(n * hc * hidden), h(n * hidden), delta(n * hidden);
  for (size_t r = 0; r < n; ++r) {
    EmbeddingRow(embed_, rows[r].token, hidden, h.data() + r * hidden);
    for (size_t j = 0; j < hc; ++j) std::copy_n(h.data() + r * hidden, hidden, x.data() + (r * hc + j) * hidden);
  }
  const HcShape shape = Hc();
  std::vector<HcWeights> mix;
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& l = layers_[li];
    HcPre(l.hc_attn, shape, x.data(), n, mix, h.data());
    KVTIER_RETURN_IF_ERROR(RmsNormRows(h.data(), n, hidden, l.attn_norm, eps));
    KVTIER_RETURN_IF_ERROR(Attention(li, rows, starts, h.data(), delta.data()));
    HcPost(shape, mix, delta.data(), n, x.data());
    HcPre(l.hc_ffn, shape, x.data(), n, mix, h.data());
    KVTIER_RETURN_IF_ERROR(RmsNormRows(h.data(), n, hidden, l.ffn_norm, eps));
    Ffn(l, rows, h.data(), delta.data());
    HcPost(shape, mix, delta.data(), n, x.data());
    KVTIER_RETURN_IF_ERROR(DeviceError());
    if (on_layer) on_layer(li);
  }
  // Logits after each sequence's last token.
  std::vector<float> last(batch.size() * hc * hidden), reduced(batch.size() * hidden);
  for (size_t b = 0; b < batch.size(); ++b) {
    std::copy_n(x.data() + (starts[b + 1] - 1) * hc * hidden, hc * hidden, last.data() + b * hc * hidden);
  }
  HcHead(hc_head_, shape, last.data(), batch.size(), reduced.data());
  KVTIER_RETURN_IF_ERROR(RmsNormRows(reduced.data(), batch.size(), hidden, norm_, eps));
  const size_t vocab = c_.vocab_size;
  std::vector<float> logits(batch.size() * vocab);
  MatMul(head_, vocab, hidden, reduced.data(), batch.size(), logits.data());
  KVTIER_RETURN_IF_ERROR(DeviceError());
  for (size_t b = 0; b < batch.size(); ++b) {
    std::copy_n(logits.data() + b * vocab, vocab, batch[b].logits.begin());
    batch[b].cache->length += static_cast<int64_t>(batch[b].tokens.size());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ForwardBackend>> LoadV4Forward(const Checkpoint& checkpoint,
                                                              std::unique_ptr<Accelerator> device) {
  auto forward = std::make_unique<V4Forward>(checkpoint.config(), std::move(device));
  KVTIER_RETURN_IF_ERROR(forward->Load(checkpoint));
  return forward;
}

std::vector<V4LayerState> NewV4State(const ModelConfig& c) {
  std::vector<V4LayerState> state(static_cast<size_t>(c.num_hidden_layers));
  for (V4LayerState& layer : state) layer.window.assign(static_cast<size_t>(c.v4->sliding_window * c.v4->head_dim), 0);
  return state;
}

}  // namespace kvtier::runtime
