#include "tests/reference/naive_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/reference/deepseek_math.h"

namespace kvtier::testing {
namespace {

using Vec = std::vector<double>;

// The checkpoint's tensors widened to double, each once per NaiveLogits call;
// an F8_E4M3 tensor times its "<name>_scale_inv" block scales, as DeepSeek's
// weight_dequant does (block size from the config).
class Weights {
 public:
  explicit Weights(const runtime::Checkpoint& ckpt) : ckpt_(ckpt) {}
  const Vec& operator()(const std::string& name) {
    auto [it, inserted] = cache_.try_emplace(name);
    if (!inserted) return it->second;
    const runtime::TensorView t = *ckpt_.Tensor(name);
    if (t.dtype != runtime::DType::kF8E4m3) {
      const std::vector<float> f = t.ToFloat();
      it->second.assign(f.begin(), f.end());
      return it->second;
    }
    const std::vector<float> scale = ckpt_.Tensor(name + "_scale_inv")->ToFloat();
    const size_t rows = t.shape[0], cols = t.shape[1];
    const size_t block_rows = ckpt_.config().fp8->block_rows, block_cols = ckpt_.config().fp8->block_cols;
    const size_t scale_cols = (cols + block_cols - 1) / block_cols;
    it->second.resize(rows * cols);
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c)
        it->second[r * cols + c] =
            kernels::ReferenceE4m3Value(t.bytes[r * cols + c]) * scale[(r / block_rows) * scale_cols + c / block_cols];
    return it->second;
  }

 private:
  const runtime::Checkpoint& ckpt_;
  std::map<std::string, Vec> cache_;
};

// y = W x, W [rows][cols].
Vec Linear(const Vec& w, const Vec& x) {
  const size_t cols = x.size(), rows = w.size() / cols;
  Vec y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) y[r] += w[r * cols + c] * x[c];
  return y;
}

Vec RmsNorm(const Vec& x, const Vec& w, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v / x.size();
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * (x[i] / std::sqrt(ms + eps));
  return y;
}

// DeepSeek-V3.2's indexer rounding of a head or key: one power-of-two
// scale, 2^ceil(log2(max(amax, 1e-4) / 448)); the values' FP8 codes. Returns
// the codes' values and sets `scale`.
Vec IndexerFp8(const Vec& v, double& scale) {
  double amax = 1e-4;
  for (double x : v) amax = std::max(amax, std::fabs(x));
  scale = std::exp2(std::ceil(std::log2(amax / 448.0)));
  Vec codes(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    codes[i] = kernels::ReferenceE4m3Value(kernels::ReferenceNearestE4m3(v[i] / scale));
  return codes;
}

// The indexer's rotation: RoPE on the first `rope` values, laid out in
// halves (not interleaved), then H v / sqrt(n) with H the Sylvester
// Hadamard matrix, entry by entry.
Vec IndexerRotate(const Vec& v, size_t rope, int64_t pos, double base, const kernels::YarnParams* yarn) {
  Vec pairs(rope);  // ReferenceRope takes interleaved pairs
  for (size_t i = 0; i < rope / 2; ++i) pairs[2 * i] = v[i], pairs[2 * i + 1] = v[rope / 2 + i];
  const Vec rotated = kernels::ReferenceRope(pairs, pos, base, yarn);
  Vec u = v;
  std::copy(rotated.begin(), rotated.end(), u.begin());
  Vec out(u.size(), 0.0);
  for (size_t i = 0; i < u.size(); ++i)
    for (size_t j = 0; j < u.size(); ++j) out[i] += (__builtin_popcountll(i & j) % 2 ? -u[j] : u[j]);
  for (double& x : out) x /= std::sqrt(static_cast<double>(u.size()));
  return out;
}

Vec Mlp(Weights& Load, const std::string& prefix, const Vec& x) {
  const Vec g = Linear(Load(prefix + "gate_proj.weight"), x);
  const Vec u = Linear(Load(prefix + "up_proj.weight"), x);
  Vec a(g.size());
  for (size_t i = 0; i < g.size(); ++i) a[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
  return Linear(Load(prefix + "down_proj.weight"), a);
}

}  // namespace

std::vector<std::vector<double>> NaiveLogits(const runtime::Checkpoint& ckpt, const std::vector<uint32_t>& tokens,
                                             const runtime::SequenceCache* stored, size_t stored_from) {
  const runtime::ModelConfig& c = ckpt.config();
  Weights Load(ckpt);
  const size_t H = c.hidden_size, heads = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim,
               vd = c.v_head_dim, kv = c.kv_lora_rank;
  const kernels::YarnParams* yarn = c.rope_scaling.has_value() ? &*c.rope_scaling : nullptr;
  // softmax_scale = q_head_dim^-0.5 * yarn_get_mscale(factor, mscale_all_dim)^2
  double scale = 1.0 / std::sqrt(static_cast<double>(nope + rope));
  if (yarn != nullptr && yarn->mscale_all_dim != 0 && yarn->factor > 1) {
    const double m = 0.1 * yarn->mscale_all_dim * std::log(yarn->factor) + 1.0;
    scale *= m * m;
  }
  const Vec& embed = Load("model.embed_tokens.weight");
  std::vector<std::vector<Vec>> latents(c.num_hidden_layers);     // [layer][token] c ‖ k_pe
  std::vector<size_t> replaced(c.num_hidden_layers, 0);           // stored blocks applied
  std::vector<std::vector<Vec>> index_keys(c.num_hidden_layers);  // [layer][token] V3.2's FP8 key values
  std::vector<std::vector<double>> index_scales(c.num_hidden_layers);
  std::vector<std::vector<double>> all_logits;
  for (size_t p = 0; p < tokens.size(); ++p) {
    Vec x(embed.begin() + tokens[p] * H, embed.begin() + (tokens[p] + 1) * H);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string pre = absl::StrCat("model.layers.", l, ".");
      const std::string a = pre + "self_attn.";
      const Vec h = RmsNorm(x, Load(pre + "input_layernorm.weight"), c.rms_norm_eps);
      const Vec qr = c.q_lora_rank.has_value() ? RmsNorm(Linear(Load(a + "q_a_proj.weight"), h),
                                                         Load(a + "q_a_layernorm.weight"), c.rms_norm_eps)
                                               : Vec();
      const Vec q =
          c.q_lora_rank.has_value() ? Linear(Load(a + "q_b_proj.weight"), qr) : Linear(Load(a + "q_proj.weight"), h);
      Vec ckv = Linear(Load(a + "kv_a_proj_with_mqa.weight"), h);
      Vec compressed(ckv.begin(), ckv.begin() + kv), k_pe(ckv.begin() + kv, ckv.end());
      compressed = RmsNorm(compressed, Load(a + "kv_a_layernorm.weight"), c.rms_norm_eps);
      k_pe = kernels::ReferenceRope(k_pe, static_cast<int64_t>(p), c.rope_theta, yarn);
      Vec row = compressed;
      row.insert(row.end(), k_pe.begin(), k_pe.end());
      latents[l].push_back(row);
      // Blocks filled before this step now hold their stored latents.
      const uint32_t tpb = stored != nullptr ? stored->tokens_per_block : 0;
      while (stored != nullptr && p >= stored_from && (replaced[l] + 1) * tpb <= p &&
             replaced[l] < stored->blocks[l].size()) {
        const size_t b = replaced[l]++;
        const kernels::BlockShape shape{tpb, static_cast<uint32_t>(kv), static_cast<uint32_t>(rope)};
        std::vector<float> block(shape.values());
        (void)kernels::Dequantize(stored->codec, shape, stored->blocks[l][b], block);
        for (size_t t = b * tpb; t < (b + 1) * tpb; ++t) {
          for (size_t i = 0; i < kv + rope; ++i) latents[l][t][i] = block[(t - b * tpb) * (kv + rope) + i];
        }
      }
      // DeepSeek-V3.2: the indexer keys this token, and its query picks the
      // index_topk tokens of highest score (all of them up to that many).
      std::vector<bool> attend(p + 1, true);
      if (c.indexer.has_value()) {
        const size_t ih = c.indexer->heads, dim = c.indexer->head_dim;
        Vec k = Linear(Load(a + "indexer.wk.weight"), h);
        double mean = 0, var = 0;
        for (double v : k) mean += v / dim;
        for (double v : k) var += (v - mean) * (v - mean) / dim;
        const Vec& kw = Load(a + "indexer.k_norm.weight");
        const Vec& kb = Load(a + "indexer.k_norm.bias");
        for (size_t i = 0; i < dim; ++i) k[i] = (k[i] - mean) / std::sqrt(var + 1e-6) * kw[i] + kb[i];
        double k_scale = 0;
        index_keys[l].push_back(
            IndexerFp8(IndexerRotate(k, rope, static_cast<int64_t>(p), c.rope_theta, yarn), k_scale));
        index_scales[l].push_back(k_scale);
        if (p + 1 > static_cast<size_t>(c.indexer->topk)) {
          const Vec iq = Linear(Load(a + "indexer.wq_b.weight"), qr);
          const Vec w = Linear(Load(a + "indexer.weights_proj.weight"), h);
          std::vector<double> index_score(p + 1, 0.0);
          for (size_t hd = 0; hd < ih; ++hd) {
            double q_scale = 0;
            const Vec qh = IndexerFp8(IndexerRotate(Vec(iq.begin() + hd * dim, iq.begin() + (hd + 1) * dim), rope,
                                                    static_cast<int64_t>(p), c.rope_theta, yarn),
                                      q_scale);
            const double weight = w[hd] / std::sqrt(double(ih)) * q_scale / std::sqrt(double(dim));
            for (size_t t = 0; t <= p; ++t) {
              double dot = 0;
              for (size_t i = 0; i < dim; ++i) dot += qh[i] * index_keys[l][t][i];
              index_score[t] += weight * std::max(dot, 0.0);
            }
          }
          for (size_t t = 0; t <= p; ++t) index_score[t] *= index_scales[l][t];
          std::vector<size_t> order(p + 1);
          std::iota(order.begin(), order.end(), size_t{0});
          std::stable_sort(order.begin(), order.end(),
                           [&](size_t x, size_t y) { return index_score[x] > index_score[y]; });
          attend.assign(p + 1, false);
          for (size_t i = 0; i < static_cast<size_t>(c.indexer->topk); ++i) attend[order[i]] = true;
        }
      }
      // Expanded attention: k = [W_UK c ; k_pe], v = W_UV c, per head, over
      // the tokens this one attends to.
      const Vec& kv_b = Load(a + "kv_b_proj.weight");
      Vec attn(heads * vd, 0.0);
      for (size_t hd = 0; hd < heads; ++hd) {
        Vec qn(q.begin() + hd * (nope + rope), q.begin() + hd * (nope + rope) + nope);
        Vec qp(q.begin() + hd * (nope + rope) + nope, q.begin() + (hd + 1) * (nope + rope));
        qp = kernels::ReferenceRope(qp, static_cast<int64_t>(p), c.rope_theta, yarn);
        std::vector<double> score(p + 1);
        std::vector<Vec> values(p + 1);
        double max = -INFINITY;
        for (size_t t = 0; t <= p; ++t) {
          if (!attend[t]) {
            score[t] = -INFINITY, values[t] = Vec(vd, 0.0);
            continue;
          }
          const Vec& lt = latents[l][t];
          Vec expanded(nope + vd, 0.0);  // kv_b_proj(compressed), this head's rows
          for (size_t r = 0; r < nope + vd; ++r)
            for (size_t j = 0; j < kv; ++j) expanded[r] += kv_b[(hd * (nope + vd) + r) * kv + j] * lt[j];
          double s = 0;
          for (size_t i = 0; i < nope; ++i) s += qn[i] * expanded[i];
          for (size_t i = 0; i < rope; ++i) s += qp[i] * lt[kv + i];
          max = std::max(max, score[t] = s * scale);
          values[t] = Vec(expanded.begin() + nope, expanded.end());
        }
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - max));
        for (size_t t = 0; t <= p; ++t)
          for (size_t i = 0; i < vd; ++i) attn[hd * vd + i] += score[t] / sum * values[t][i];
      }
      const Vec o = Linear(Load(a + "o_proj.weight"), attn);
      for (size_t i = 0; i < H; ++i) x[i] += o[i];
      const Vec h2 = RmsNorm(x, Load(pre + "post_attention_layernorm.weight"), c.rms_norm_eps);
      Vec ffn(H, 0.0);
      if (!c.IsMoeLayer(l)) {
        ffn = Mlp(Load, pre + "mlp.", h2);
      } else {
        const Vec router = Linear(Load(pre + "mlp.gate.weight"), h2);
        kernels::GateParams g;
        g.top_k = static_cast<uint32_t>(c.num_experts_per_tok);
        g.group_limited = c.topk_method == runtime::TopkMethod::kGroupLimitedGreedy;
        g.noaux_tc = c.topk_method == runtime::TopkMethod::kNoauxTc;
        g.n_group = static_cast<uint32_t>(c.n_group);
        g.topk_group = static_cast<uint32_t>(c.topk_group);
        g.norm_topk_prob = c.norm_topk_prob;
        g.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
        std::vector<float> bias;
        if (g.noaux_tc) {
          const Vec& b = Load(pre + "mlp.gate.e_score_correction_bias");
          bias.assign(b.begin(), b.end());
          g.correction_bias = bias;
        }
        for (const auto& [e, w] : kernels::ReferenceGate(std::vector<float>(router.begin(), router.end()), g)) {
          const Vec y = Mlp(Load, absl::StrCat(pre, "mlp.experts.", e, "."), h2);
          for (size_t i = 0; i < H; ++i) ffn[i] += w * y[i];
        }
        if (c.n_shared_experts > 0) {
          const Vec y = Mlp(Load, pre + "mlp.shared_experts.", h2);
          for (size_t i = 0; i < H; ++i) ffn[i] += y[i];
        }
      }
      for (size_t i = 0; i < H; ++i) x[i] += ffn[i];
    }
    all_logits.push_back(Linear(Load("lm_head.weight"), RmsNorm(x, Load("model.norm.weight"), c.rms_norm_eps)));
  }
  return all_logits;
}

double RelativeError(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, mag = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    mag = std::max(mag, std::fabs(want[i]));
  }
  return diff / mag;
}

}  // namespace kvtier::testing
