#include "tests/reference/naive_v4.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <numbers>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvtier/kernels/float_formats.h"
#include "tests/reference/deepseek_math.h"

namespace kvtier::testing {
namespace {

using Vec = std::vector<double>;

// The checkpoint's tensors widened to double, each once: an F8_E4M3
// weight times its E8M0 (or F32) block scales "<name>.scale", an I8 one
// (MXFP4: two E2M1 codes a byte, the first low) likewise per 32 values.
class Tensors {
 public:
  explicit Tensors(const runtime::Checkpoint& ckpt) : ckpt_(ckpt) {}
  const Vec& operator()(const std::string& name) {
    auto [it, inserted] = cache_.try_emplace(name);
    if (inserted) it->second = Load(name);
    return it->second;
  }
  // Stored in FP8 or FP4: the model's products over it round their inputs.
  bool Quantized(const std::string& name) const {
    const runtime::DType d = ckpt_.Tensor(name)->dtype;
    return d == runtime::DType::kF8E4m3 || d == runtime::DType::kI8;
  }

 private:
  Vec Load(const std::string& name) const {
    const runtime::TensorView t = *ckpt_.Tensor(name);
    const std::vector<float> f = t.ToFloat();
    if (!Quantized(name)) return Vec(f.begin(), f.end());
    const std::string base = name.substr(0, name.size() - std::string(".weight").size());
    const std::vector<float> scale = ckpt_.Tensor(base + ".scale")->ToFloat();
    const size_t rows = t.shape[0];
    Vec w;
    if (t.dtype == runtime::DType::kI8) {
      static constexpr double kGrid[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
      const size_t cols = t.shape[1] * 2;
      for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < cols; ++c) {
          const int code = (t.bytes[(r * cols + c) / 2] >> (c % 2 ? 4 : 0)) & 0xf;
          w.push_back((code & 8 ? -1 : 1) * kGrid[code & 7] * scale[r * (cols / 32) + c / 32]);
        }
      return w;
    }
    const size_t cols = t.shape[1], block_rows = ckpt_.config().fp8->block_rows;
    const size_t block_cols = ckpt_.config().fp8->block_cols, scale_cols = (cols + block_cols - 1) / block_cols;
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) {
        w.push_back(kernels::ReferenceE4m3Value(t.bytes[r * cols + c]) *
                    scale[(r / block_rows) * scale_cols + c / block_cols]);
      }
    return w;
  }

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

// RMSNorm of x[begin, begin + n), times w when given.
void RmsNorm(Vec& x, size_t begin, size_t n, const Vec* w, double eps) {
  double ms = 0;
  for (size_t i = 0; i < n; ++i) ms += x[begin + i] * x[begin + i] / n;
  const double inv = 1.0 / std::sqrt(ms + eps);
  for (size_t i = 0; i < n; ++i) x[begin + i] *= inv * (w ? (*w)[i] : 1.0);
}

double Sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// model.py's precompute_freqs_cis: frequencies, YaRN-blended when given.
Vec Frequencies(size_t dim, double base, const kernels::YarnParams* yarn) {
  Vec f(dim / 2);
  for (size_t i = 0; i < dim / 2; ++i) f[i] = 1.0 / std::pow(base, static_cast<double>(2 * i) / dim);
  if (yarn == nullptr) return f;
  const auto correction = [&](double rotations) {
    return dim * std::log(yarn->original_max_position_embeddings / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(base));
  };
  const double low = std::max(std::floor(correction(yarn->beta_fast)), 0.0);
  double high = std::min(std::ceil(correction(yarn->beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (size_t i = 0; i < dim / 2; ++i) {
    const double smooth = 1.0 - std::clamp((i - low) / (high - low), 0.0, 1.0);
    f[i] = f[i] / yarn->factor * (1 - smooth) + f[i] * smooth;
  }
  return f;
}

// x[begin..] pairs times e^(+-i pos f).
void Rotate(Vec& x, size_t begin, const Vec& freq, int64_t pos, bool inverse = false) {
  for (size_t i = 0; i < freq.size(); ++i) {
    const double angle = (inverse ? -1.0 : 1.0) * static_cast<double>(pos) * freq[i];
    const double re = x[begin + 2 * i], im = x[begin + 2 * i + 1];
    x[begin + 2 * i] = re * std::cos(angle) - im * std::sin(angle);
    x[begin + 2 * i + 1] = re * std::sin(angle) + im * std::cos(angle);
  }
}

// x[begin, begin + n) as the bf16 values the model's cache holds.
void RoundBf16(Vec& x, size_t begin, size_t n) {
  for (size_t i = begin; i < begin + n; ++i)
    x[i] = kernels::Bf16ToFloat(kernels::FloatToBf16(static_cast<float>(x[i])));
}

// 2^ceil(log2(v)).
double PowerOfTwoCeil(double v) { return std::exp2(std::ceil(std::log2(v))); }

// Rounds x[begin, begin + n) through FP8 in blocks, the value first taken
// as the float the model holds.
void RoundFp8(Vec& x, size_t begin, size_t n, size_t block) {
  for (size_t b = begin; b < begin + n; b += block) {
    float amax = 1e-4f;
    for (size_t i = b; i < b + block; ++i) amax = std::max(amax, std::fabs(static_cast<float>(x[i])));
    const double scale = PowerOfTwoCeil(amax * (1.0f / 448.0f));
    for (size_t i = b; i < b + block; ++i) {
      const double q = std::clamp(static_cast<float>(x[i]) / scale, -448.0, 448.0);
      x[i] = kernels::ReferenceE4m3Value(kernels::ReferenceNearestE4m3(q)) * scale;
    }
  }
}

// How many of x's values (blocks of `block`) lie so near a rounding
// boundary, within 3e-7 of their block's largest value, that float and
// double arithmetic may round them to different FP8 codes; and blocks
// whose scale may differ so.
size_t AmbiguousFp8(const Vec& x, size_t block) {
  size_t ambiguous = 0;
  for (size_t b = 0; b < x.size(); b += block) {
    double amax = 1e-4;
    for (size_t i = b; i < b + block; ++i) amax = std::max(amax, std::fabs(x[i]));
    const double margin = 3e-7 * amax;
    const auto scale = [](double a) { return PowerOfTwoCeil(static_cast<float>(a) * (1.0f / 448.0f)); };
    if (scale(amax - margin) != scale(amax + margin)) ++ambiguous;
    const double s = scale(amax);
    for (size_t i = b; i < b + block; ++i) {
      const double lo = std::clamp((x[i] - margin) / s, -448.0, 448.0),
                   hi = std::clamp((x[i] + margin) / s, -448.0, 448.0);
      if (kernels::ReferenceNearestE4m3(lo) != kernels::ReferenceNearestE4m3(hi)) ++ambiguous;
    }
  }
  return ambiguous;
}

// The E2M1 value nearest to q (|q| <= 6), ties to the even code.
double NearestE2m1(double q) {
  static constexpr double kGrid[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  int best = 0;
  for (int code = 1; code < 8; ++code) {
    const double d = std::fabs(kGrid[code] - std::fabs(q)), b = std::fabs(kGrid[best] - std::fabs(q));
    if (d < b || (d == b && code % 2 == 0)) best = code;
  }
  return std::copysign(kGrid[best], q);
}

void RoundFp4(Vec& x, size_t begin, size_t n, size_t block) {
  for (size_t b = begin; b < begin + n; b += block) {
    float amax = 6.0f * std::ldexp(1.0f, -126);
    for (size_t i = b; i < b + block; ++i) amax = std::max(amax, std::fabs(static_cast<float>(x[i])));
    const double scale = PowerOfTwoCeil(amax * (1.0f / 6.0f));
    for (size_t i = b; i < b + block; ++i)
      x[i] = NearestE2m1(std::clamp(static_cast<float>(x[i]) / scale, -6.0, 6.0)) * scale;
  }
}

// x[begin, begin + n) times the Sylvester Hadamard matrix / sqrt(n).
void Hadamard(Vec& x, size_t begin, size_t n) {
  Vec y(n, 0.0);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) y[i] += (std::popcount(i & j) % 2 ? -1.0 : 1.0) * x[begin + j];
  for (size_t i = 0; i < n; ++i) x[begin + i] = y[i] / std::sqrt(static_cast<double>(n));
}

// Takes engine[i] for rounded[i] (i in [begin, end)) where the value
// before rounding lies within 1e-5 of the midpoint between the two codes,
// relative to the largest value of the range (float arithmetic's error is
// relative to a vector's scale, not to each small value of it).
size_t Reconcile(Vec& rounded, const Vec& before, const float* engine, size_t begin, size_t end) {
  double scale = 1e-30;
  for (size_t i = begin; i < end; ++i) scale = std::max(scale, std::fabs(before[i]));
  size_t adopted = 0;
  for (size_t i = begin; i < end; ++i) {
    if (rounded[i] == engine[i]) continue;
    const double midpoint = (rounded[i] + engine[i]) / 2;
    if (std::fabs(before[i] - midpoint) <= 1e-5 * scale) {
      rounded[i] = engine[i];
      ++adopted;
    }
  }
  return adopted;
}

struct Hc {
  Vec pre, post, comb;  // comb[j * hc + k]
};

// Block.hc_pre's weights for one row's copies (flattened).
Hc HcWeights(const Vec& copies, const Vec& fn, const Vec& base, const Vec& scale, size_t hc, double eps, double hc_eps,
             int iters) {
  double ms = 0;
  for (double v : copies) ms += v * v / copies.size();
  Vec mixes = Linear(fn, copies);
  for (double& m : mixes) m /= std::sqrt(ms + eps);
  Hc w{Vec(hc), Vec(hc), Vec(hc * hc)};
  for (size_t j = 0; j < hc; ++j) {
    w.pre[j] = Sigmoid(mixes[j] * scale[0] + base[j]) + hc_eps;
    w.post[j] = 2 * Sigmoid(mixes[hc + j] * scale[1] + base[hc + j]);
  }
  for (size_t j = 0; j < hc; ++j) {
    double top = -INFINITY, sum = 0;
    for (size_t k = 0; k < hc; ++k)
      top = std::max(top, mixes[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k]);
    for (size_t k = 0; k < hc; ++k) {
      sum += w.comb[j * hc + k] = std::exp(mixes[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k] - top);
    }
    for (size_t k = 0; k < hc; ++k) w.comb[j * hc + k] = w.comb[j * hc + k] / sum + hc_eps;
  }
  const auto columns = [&] {
    for (size_t k = 0; k < hc; ++k) {
      double sum = 0;
      for (size_t j = 0; j < hc; ++j) sum += w.comb[j * hc + k];
      for (size_t j = 0; j < hc; ++j) w.comb[j * hc + k] /= sum + hc_eps;
    }
  };
  columns();
  for (int it = 1; it < iters; ++it) {
    for (size_t j = 0; j < hc; ++j) {
      const double sum = std::accumulate(w.comb.begin() + j * hc, w.comb.begin() + (j + 1) * hc, 0.0);
      for (size_t k = 0; k < hc; ++k) w.comb[j * hc + k] /= sum + hc_eps;
    }
    columns();
  }
  return w;
}

Vec Reduce(const Vec& copies, const Vec& pre, size_t hidden) {
  Vec y(hidden, 0.0);
  for (size_t j = 0; j < pre.size(); ++j)
    for (size_t i = 0; i < hidden; ++i) y[i] += pre[j] * copies[j * hidden + i];
  return y;
}

class Reference {
 public:
  Reference(const runtime::Checkpoint& ckpt, const std::vector<uint32_t>& tokens, const NaiveV4Options& o)
      : c_(ckpt.config()), v4_(*ckpt.config().v4), w_(ckpt), tokens_(tokens), o_(o) {}

  NaiveV4Result Run();

 private:
  // Each position's attention output [hidden] at layer li from its input.
  std::vector<Vec> Attention(size_t li, const std::vector<Vec>& x, NaiveV4Result& result);
  // The compressed entries of every closed group (prefill form).
  std::vector<Vec> Compress(const std::string& p, const std::vector<Vec>& x, size_t ratio, size_t dim, const Vec& freq,
                            bool index, const std::vector<float>* engine);
  Vec Moe(size_t li, const Vec& x, uint32_t token);
  Vec Expert(const std::string& p, const Vec& x, double weight);
  // W x for the tensor `name`; over an FP8 or FP4 one the input is first
  // rounded to FP8 in blocks of 128, as the model's GEMMs take it.
  Vec Product(const std::string& name, Vec x) {
    if (w_.Quantized(name)) {
      ambiguous_ += AmbiguousFp8(x, 128);
      RoundFp8(x, 0, x.size(), 128);
    }
    return Linear(w_(name), x);
  }

  const runtime::ModelConfig& c_;
  const runtime::V4Config& v4_;
  Tensors w_;
  const std::vector<uint32_t>& tokens_;
  const NaiveV4Options o_;
  size_t adopted_ = 0, ambiguous_ = 0;
};

std::vector<Vec> Reference::Compress(const std::string& p, const std::vector<Vec>& x, size_t ratio, size_t dim,
                                     const Vec& freq, bool index, const std::vector<float>* engine) {
  const bool overlap = ratio == 4;
  const size_t width = (overlap ? 2 : 1) * dim, rd = c_.qk_rope_head_dim;
  std::vector<Vec> kv, score;
  const Vec& ape = w_(p + ".ape");
  for (size_t t = 0; t < x.size(); ++t) {
    kv.push_back(Linear(w_(p + ".wkv.weight"), x[t]));
    score.push_back(Linear(w_(p + ".wgate.weight"), x[t]));
    for (size_t i = 0; i < width; ++i) score[t][i] += ape[(t % ratio) * width + i];
  }
  std::vector<Vec> entries;
  for (size_t g = 0; g < x.size() / ratio; ++g) {
    Vec entry(dim, 0.0);
    for (size_t i = 0; i < dim; ++i) {
      std::vector<std::pair<double, double>> pooled;  // (score, value)
      if (overlap && g > 0) {
        for (size_t t = (g - 1) * ratio; t < g * ratio; ++t) pooled.push_back({score[t][i], kv[t][i]});
      }
      const size_t own = overlap ? dim + i : i;
      for (size_t t = g * ratio; t < (g + 1) * ratio; ++t) pooled.push_back({score[t][own], kv[t][own]});
      double top = -INFINITY, sum = 0, dot = 0;
      for (const auto& [s, v] : pooled) top = std::max(top, s);
      for (const auto& [s, v] : pooled) {
        sum += std::exp(s - top);
        dot += std::exp(s - top) * v;
      }
      entry[i] = dot / sum;
    }
    RmsNorm(entry, 0, dim, &w_(p + ".norm.weight"), c_.rms_norm_eps);
    Rotate(entry, dim - rd, freq, static_cast<int64_t>(g * ratio));
    if (index) Hadamard(entry, 0, dim);
    const Vec before = entry;
    if (index) {
      RoundFp4(entry, 0, dim, 32);
    } else if (o_.fp8_rounding) {
      RoundFp8(entry, 0, dim - rd, 64);
      RoundBf16(entry, dim - rd, rd);
    }
    if (engine != nullptr && engine->size() >= (g + 1) * dim) {
      adopted_ += Reconcile(entry, before, engine->data() + g * dim, 0, dim);
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::vector<Vec> Reference::Attention(size_t li, const std::vector<Vec>& x, NaiveV4Result& result) {
  const std::string p = absl::StrCat("layers.", li, ".attn.");
  const size_t T = x.size(), heads = c_.num_attention_heads, hd = v4_.head_dim, rd = c_.qk_rope_head_dim;
  const size_t ratio = v4_.compress_ratios[li], window = v4_.sliding_window;
  const double eps = c_.rms_norm_eps;
  const bool compressed = ratio > 0;
  kernels::YarnParams yarn;
  if (c_.rope_scaling) yarn = *c_.rope_scaling;
  const bool with_yarn = c_.rope_scaling.has_value() && (compressed || o_.yarn_on_window);
  const Vec freq = Frequencies(rd, compressed ? v4_.compress_rope_theta : c_.rope_theta, with_yarn ? &yarn : nullptr);
  std::vector<Vec> q(T), kv(T), qr(T);
  for (size_t t = 0; t < T; ++t) {
    qr[t] = Product(p + "wq_a.weight", x[t]);
    RmsNorm(qr[t], 0, qr[t].size(), &w_(p + "q_norm.weight"), eps);
    q[t] = Product(p + "wq_b.weight", qr[t]);
    for (size_t h = 0; h < heads; ++h) {
      RmsNorm(q[t], h * hd, hd, nullptr, eps);
      Rotate(q[t], h * hd + hd - rd, freq, static_cast<int64_t>(t));
    }
    kv[t] = Product(p + "wkv.weight", x[t]);
    RmsNorm(kv[t], 0, hd, &w_(p + "kv_norm.weight"), eps);
    Rotate(kv[t], hd - rd, freq, static_cast<int64_t>(t));
    const Vec before = kv[t];
    if (o_.fp8_rounding) {
      RoundFp8(kv[t], 0, hd - rd, 64);
      RoundBf16(kv[t], hd - rd, rd);
    }
    if (o_.engine_trace != nullptr && li < o_.engine_trace->window.size() && t < o_.engine_trace->window[li].size()) {
      adopted_ += Reconcile(kv[t], before, o_.engine_trace->window[li][t].data(), 0, hd);
    }
  }
  result.window[li] = kv;
  std::vector<Vec> entries;
  const runtime::V4LayerState* engine = o_.engine_state != nullptr ? &(*o_.engine_state)[li] : nullptr;
  if (compressed)
    entries = Compress(p + "compressor", x, ratio, hd, freq, false, engine ? &engine->compressed : nullptr);
  for (const Vec& e : entries) result.compressed[li].insert(result.compressed[li].end(), e.begin(), e.end());
  // The indexer's keys and each position's queries and head weights.
  std::vector<Vec> keys, iq(T), iw(T);
  const bool csa = ratio == 4;
  const size_t ih = csa ? c_.indexer->heads : 0, ihd = csa ? c_.indexer->head_dim : 0;
  if (csa) {
    keys = Compress(p + "indexer.compressor", x, ratio, ihd, freq, true, engine ? &engine->index_keys : nullptr);
    for (const Vec& k : keys) result.index_keys[li].insert(result.index_keys[li].end(), k.begin(), k.end());
    for (size_t t = 0; t < T; ++t) {
      iq[t] = Product(p + "indexer.wq_b.weight", qr[t]);
      for (size_t h = 0; h < ih; ++h) {
        Rotate(iq[t], h * ihd + ihd - rd, freq, static_cast<int64_t>(t));
        Hadamard(iq[t], h * ihd, ihd);
        const Vec before = iq[t];
        RoundFp4(iq[t], h * ihd, ihd, 32);
        if (o_.engine_trace != nullptr && li < o_.engine_trace->index_query.size() &&
            t < o_.engine_trace->index_query[li].size()) {
          adopted_ += Reconcile(iq[t], before, o_.engine_trace->index_query[li][t].data(), h * ihd, (h + 1) * ihd);
        }
      }
      iw[t] = Linear(w_(p + "indexer.weights_proj.weight"), x[t]);
      for (double& v : iw[t]) v *= 1.0 / std::sqrt(static_cast<double>(ihd)) / std::sqrt(static_cast<double>(ih));
    }
  }
  const Vec& sink = w_(p + "attn_sink");
  const size_t groups = v4_.o_groups, o_lora = v4_.o_lora_rank, group_width = heads * hd / groups;
  const Vec& wo_a = w_(p + "wo_a.weight");
  std::vector<Vec> out(T);
  for (size_t t = 0; t < T; ++t) {
    std::vector<const Vec*> attended;
    for (size_t s = t + 1 > window ? t + 1 - window : 0; s <= t; ++s) attended.push_back(&kv[s]);
    const size_t visible = compressed ? (t + 1) / ratio : 0;
    std::vector<uint32_t> chosen(visible);
    std::iota(chosen.begin(), chosen.end(), 0u);
    if (csa) {
      Vec score(visible, 0.0);
      for (size_t g = 0; g < visible; ++g) {
        for (size_t h = 0; h < ih; ++h) {
          double dot = 0;
          for (size_t i = 0; i < ihd; ++i) dot += iq[t][h * ihd + i] * keys[g][i];
          score[g] += std::max(dot, 0.0) * iw[t][h];
        }
      }
      std::stable_sort(chosen.begin(), chosen.end(), [&](uint32_t a, uint32_t b) { return score[a] > score[b]; });
      const size_t k = std::min<size_t>(c_.indexer->topk, visible);
      result.tied[li].push_back(
          k < visible && std::fabs(score[chosen[k - 1]] - score[chosen[k]]) <=
                             1e-5 * std::max({std::fabs(score[chosen[k - 1]]), std::fabs(score[chosen[k]]), 1e-30}));
      if (o_.indexer) chosen.resize(k);
      std::sort(chosen.begin(), chosen.end());
      result.chosen[li].push_back(chosen);
    }
    for (uint32_t g : chosen) attended.push_back(&entries[g]);
    Vec o(heads * hd, 0.0);
    for (size_t h = 0; h < heads; ++h) {
      Vec s(attended.size());
      double top = -INFINITY;
      for (size_t e = 0; e < attended.size(); ++e) {
        double dot = 0;
        for (size_t i = 0; i < hd; ++i) dot += q[t][h * hd + i] * (*attended[e])[i];
        s[e] = dot / std::sqrt(static_cast<double>(hd));
        top = std::max(top, s[e]);
      }
      double denominator = o_.sinks ? std::exp(sink[h] - top) : 0.0;
      for (double& v : s) denominator += v = std::exp(v - top);
      for (size_t e = 0; e < attended.size(); ++e)
        for (size_t i = 0; i < hd; ++i) o[h * hd + i] += s[e] / denominator * (*attended[e])[i];
      if (o_.inverse_rope) Rotate(o, h * hd + hd - rd, freq, static_cast<int64_t>(t), /*inverse=*/true);
    }
    Vec low(groups * o_lora, 0.0);
    for (size_t g = 0; g < groups; ++g)
      for (size_t r = 0; r < o_lora; ++r)
        for (size_t i = 0; i < group_width; ++i)
          low[g * o_lora + r] += wo_a[(g * o_lora + r) * group_width + i] * o[g * group_width + i];
    out[t] = Product(p + "wo_b.weight", low);
  }
  return out;
}

// An expert's SwiGLU, its routing weight applied before w2 (as model.py's
// Expert does, which matters where w2 rounds its input).
Vec Reference::Expert(const std::string& p, const Vec& x, double weight) {
  Vec gate = Product(p + ".w1.weight", x), up = Product(p + ".w3.weight", x);
  const double limit = v4_.swiglu_limit;
  for (size_t i = 0; i < gate.size(); ++i) {
    if (limit > 0) {
      gate[i] = std::min(gate[i], limit);
      up[i] = std::clamp(up[i], -limit, limit);
    }
    gate[i] = weight * gate[i] * Sigmoid(gate[i]) * up[i];
  }
  return Product(p + ".w2.weight", gate);
}

Vec Reference::Moe(size_t li, const Vec& x, uint32_t token) {
  const std::string p = absl::StrCat("layers.", li, ".ffn.");
  const size_t experts = c_.n_routed_experts, k = c_.num_experts_per_tok;
  Vec score = Linear(w_(p + "gate.weight"), x);
  for (double& s : score) s = std::sqrt(std::log1p(std::exp(s)));
  std::vector<uint32_t> ids(experts);
  if (static_cast<int64_t>(li) < v4_.num_hash_layers) {
    const Vec& table = w_(p + "gate.tid2eid");
    for (size_t i = 0; i < k; ++i) ids[i] = static_cast<uint32_t>(table[token * k + i]);
  } else {
    const Vec& bias = w_(p + "gate.bias");
    std::iota(ids.begin(), ids.end(), 0u);
    std::stable_sort(ids.begin(), ids.end(),
                     [&](uint32_t a, uint32_t b) { return score[a] + bias[a] > score[b] + bias[b]; });
  }
  ids.resize(k);
  double sum = 0;
  for (uint32_t e : ids) sum += score[e];
  Vec y = Expert(p + "shared_experts", x, 1.0);
  for (uint32_t e : ids) {
    const Vec ye = Expert(absl::StrCat(p, "experts.", e), x, score[e] / sum * c_.routed_scaling_factor);
    for (size_t i = 0; i < y.size(); ++i) y[i] += ye[i];
  }
  return y;
}

NaiveV4Result Reference::Run() {
  const size_t T = tokens_.size(), hidden = c_.hidden_size, hc = v4_.hc_mult, layers = c_.num_hidden_layers;
  const double eps = c_.rms_norm_eps;
  NaiveV4Result result;
  result.chosen.resize(layers);
  result.tied.resize(layers);
  result.compressed.resize(layers);
  result.index_keys.resize(layers);
  result.window.resize(layers);
  std::vector<Vec> x(T, Vec(hc * hidden));  // each position's copies
  const Vec& embed = w_("embed.weight");
  for (size_t t = 0; t < T; ++t)
    for (size_t j = 0; j < hc; ++j) std::copy_n(embed.begin() + tokens_[t] * hidden, hidden, x[t].begin() + j * hidden);
  const auto half = [&](const std::string& name, auto&& branch) {
    std::vector<Hc> mix(T);
    std::vector<Vec> in(T);
    for (size_t t = 0; t < T; ++t) {
      mix[t] = HcWeights(x[t], w_(name + "_fn"), w_(name + "_base"), w_(name + "_scale"), hc, eps, v4_.hc_eps,
                         static_cast<int>(v4_.hc_sinkhorn_iters));
      in[t] = Reduce(x[t], mix[t].pre, hidden);
    }
    const std::vector<Vec> out = branch(in);
    for (size_t t = 0; t < T; ++t) {
      Vec next(hc * hidden, 0.0);
      for (size_t k = 0; k < hc; ++k)
        for (size_t i = 0; i < hidden; ++i) {
          next[k * hidden + i] = mix[t].post[k] * out[t][i];
          for (size_t j = 0; j < hc; ++j) next[k * hidden + i] += mix[t].comb[j * hc + k] * x[t][j * hidden + i];
        }
      x[t] = std::move(next);
    }
  };
  for (size_t li = 0; li < layers; ++li) {
    const std::string p = absl::StrCat("layers.", li, ".");
    half(p + "hc_attn", [&](std::vector<Vec> in) {
      for (Vec& v : in) RmsNorm(v, 0, hidden, &w_(p + "attn_norm.weight"), eps);
      return Attention(li, in, result);
    });
    half(p + "hc_ffn", [&](std::vector<Vec> in) {
      std::vector<Vec> out(T);
      for (size_t t = 0; t < T; ++t) {
        RmsNorm(in[t], 0, hidden, &w_(p + "ffn_norm.weight"), eps);
        out[t] = Moe(li, in[t], tokens_[t]);
      }
      return out;
    });
  }
  for (size_t t = 0; t < T; ++t) {
    double ms = 0;
    for (double v : x[t]) ms += v * v / x[t].size();
    const Vec mixes = Linear(w_("hc_head_fn"), x[t]);
    Vec pre(hc);
    for (size_t j = 0; j < hc; ++j) {
      pre[j] = Sigmoid(mixes[j] / std::sqrt(ms + eps) * w_("hc_head_scale")[0] + w_("hc_head_base")[j]) + v4_.hc_eps;
    }
    Vec y = Reduce(x[t], pre, hidden);
    RmsNorm(y, 0, hidden, &w_("norm.weight"), eps);
    result.logits.push_back(Linear(w_("head.weight"), y));
  }
  result.adopted = adopted_;
  result.ambiguous_inputs = ambiguous_;
  return result;
}

}  // namespace

NaiveV4Result NaiveV4Forward(const runtime::Checkpoint& ckpt, const std::vector<uint32_t>& tokens,
                             const NaiveV4Options& options) {
  return Reference(ckpt, tokens, options).Run();
}

}  // namespace kvtier::testing
