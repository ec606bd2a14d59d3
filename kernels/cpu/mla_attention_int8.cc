#include "mla_attention_int8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "codec_internal.h"
#include "kvtier/kernels/float_formats.h"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 unpack intrinsics pass an undefined vector as their
// unused merge source, which -Wmaybe-uninitialized reports at each use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define KVTIER_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#endif

namespace kvtier::kernels::cpu {
namespace {

constexpr float kInt16Max = 32767.0f;

// The block's per-channel scales (bf16, before the codes) as floats.
std::vector<float> Scales(const uint8_t* payload, uint32_t dim) {
  std::vector<float> scale(dim);
  for (uint32_t c = 0; c < dim; ++c) scale[c] = Bf16ToFloat(LoadU16(payload + 2 * c));
  return scale;
}

}  // namespace

#ifdef KVTIER_VNNI

bool Int8VnniUsable(uint32_t dim, uint32_t kv_lora_rank) {
  static const bool cpu = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512vnni");
  return cpu && dim % 32 == 0 && kv_lora_rank % 16 == 0 && dim <= 8192;
}

namespace {

// Rounds x[i] * mul[i] (mul may be null: 1) for i < n to int16 with one
// scale (max |x * mul| -> 32767); returns the value of one int16 step.
KVTIER_VNNI inline __mmask16 Remaining(size_t n, size_t i) {
  return static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
}

KVTIER_VNNI inline __m512 LoadProduct(const float* x, const float* mul, size_t i, __mmask16 m) {
  const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
  return mul == nullptr ? v : _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, mul + i));
}

KVTIER_VNNI float ToInt16(const float* x, const float* mul, size_t n, int16_t* out) {
  __m512 max = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    max = _mm512_max_ps(max, _mm512_abs_ps(LoadProduct(x, mul, i, Remaining(n, i))));
  }
  const float top = _mm512_reduce_max_ps(max);
  if (top == 0.0f) {
    std::fill(out, out + n, int16_t{0});
    return 0.0f;
  }
  const __m512 to_int = _mm512_set1_ps(kInt16Max / top);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = Remaining(n, i);
    // Round to nearest even (the default mode), then narrow; |v| <= 32767.
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(LoadProduct(x, mul, i, m), to_int));
    _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtsepi32_epi16(v));
  }
  return top / kInt16Max;
}

// Sums each of 16 vectors: lane h of the result is the sum of acc[h]'s lanes.
KVTIER_VNNI __attribute__((always_inline)) inline __m512i SumEach(const __m512i acc[16]) {
  __m512i pairs[8], quads[4];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: a0+a2, b0+b2, a1+a3, b1+b3
    pairs[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[2 * i], acc[2 * i + 1]),
                                _mm512_unpackhi_epi32(acc[2 * i], acc[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane's sum of 4 heads
    quads[i] = _mm512_add_epi64(_mm512_unpacklo_epi64(pairs[2 * i], pairs[2 * i + 1]),
                                _mm512_unpackhi_epi64(pairs[2 * i], pairs[2 * i + 1]));
  }
  // quads[i] holds heads 4i..4i+3 in each of its four 128-bit lanes; sum
  // the lanes so that heads 4i..4i+3 land in lane i.
  const __m512i v01 = _mm512_add_epi32(_mm512_shuffle_i32x4(quads[0], quads[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(quads[0], quads[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i v23 = _mm512_add_epi32(_mm512_shuffle_i32x4(quads[2], quads[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(quads[2], quads[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(v01, v23, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(v01, v23, _MM_SHUFFLE(3, 1, 3, 1)));
}

}  // namespace

namespace {

// The block's widest channels (largest scales) are multiplied in float:
// one outlier channel would otherwise set the int16 step of every query
// (measured: errors of 1.4e-4 against float64 with a 20x outlier channel).
constexpr uint32_t kFloatChannels = 4;

// The first kHeads rows of q16 ([16][dim]) regrouped as ScoreTokens reads
// them: [dim / 32][kHeads][32], so one pointer reaches every head's group.
template <uint32_t kHeads>
const int16_t* Grouped(const std::vector<int16_t>& q16, uint32_t dim, std::vector<int16_t>& out) {
  for (uint32_t g = 0; g < dim / 32; ++g)
    for (uint32_t h = 0; h < kHeads; ++h)
      std::copy_n(q16.data() + size_t{h} * dim + 32 * g, 32, out.data() + (size_t{g} * kHeads + h) * 32);
  return out.data();
}

// Scores of kHeads heads (q16: [dim / 32][kHeads][32] int16, each group of
// 32 channels of all the heads together) against every token of the block,
// plus the float channels (wide_q: [channel][16 heads]); lane h of each
// token's result is head h.
template <uint32_t kHeads>
KVTIER_VNNI void ScoreTokens(const int8_t* codes, uint32_t tokens, uint32_t dim, const int16_t* q16,
                             const float* step, const uint32_t* wide, const float* wide_q, uint32_t n,
                             float* scores, size_t stride) {
  const __m512 steps = _mm512_load_ps(step);
  for (uint32_t t = 0; t < tokens; ++t) {
    const int8_t* code = codes + size_t{t} * dim;
    __m512i acc[16];
    for (auto& a : acc) a = _mm512_setzero_si512();
    for (uint32_t g = 0; g < dim / 32; ++g) {
      const __m512i c16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(code + 32 * g)));
      const int16_t* qg = q16 + size_t{g} * kHeads * 32;
      for (uint32_t h = 0; h < kHeads; ++h) acc[h] = _mm512_dpwssd_epi32(acc[h], c16, _mm512_loadu_si512(qg + 32 * h));
    }
    __m512 score = _mm512_mul_ps(_mm512_cvtepi32_ps(SumEach(acc)), steps);
    for (uint32_t j = 0; j < kFloatChannels; ++j) {
      score = _mm512_fmadd_ps(_mm512_load_ps(wide_q + 16 * j), _mm512_set1_ps(code[wide[j]]), score);
    }
    alignas(64) float out[16];
    _mm512_store_ps(out, score);
    for (uint32_t h = 0; h < n; ++h) scores[size_t{h} * stride + t] = out[h];
  }
}

}  // namespace

KVTIER_VNNI void Int8BlockScores(const uint8_t* payload, uint32_t tokens, uint32_t dim, uint32_t heads,
                                 const float* q, float* scores, size_t stride) {
  const std::vector<float> scale = Scales(payload, dim);
  const auto* codes = reinterpret_cast<const int8_t*>(payload + 2 * size_t{dim});
  uint32_t wide[kFloatChannels];  // channel indices, widest scale first
  std::vector<uint32_t> order(dim);
  for (uint32_t c = 0; c < dim; ++c) order[c] = c;
  std::partial_sort(order.begin(), order.begin() + kFloatChannels, order.end(),
                    [&](uint32_t a, uint32_t b) { return std::fabs(scale[a]) > std::fabs(scale[b]); });
  std::copy_n(order.begin(), kFloatChannels, wide);
  // Queries with the scales folded in, as int16 without the float channels,
  // up to 16 heads a pass; a pass of 8 or 4 heads skips the products of the
  // missing ones.
  std::vector<int16_t> q16(size_t{16} * dim), grouped(size_t{16} * dim);
  std::vector<float> qs(dim);
  for (uint32_t h0 = 0; h0 < heads; h0 += 16) {
    const uint32_t n = std::min(16u, heads - h0);
    std::fill(q16.begin(), q16.end(), int16_t{0});
    alignas(64) float step[16] = {};
    alignas(64) float wide_q[kFloatChannels * 16] = {};
    for (uint32_t h = 0; h < n; ++h) {
      const float* qh = q + size_t{h0 + h} * dim;
      for (uint32_t c = 0; c < dim; ++c) qs[c] = qh[c] * scale[c];
      for (uint32_t j = 0; j < kFloatChannels; ++j) {
        wide_q[16 * j + h] = qs[wide[j]];
        qs[wide[j]] = 0.0f;
      }
      step[h] = ToInt16(qs.data(), nullptr, dim, q16.data() + size_t{h} * dim);
    }
    float* s = scores + size_t{h0} * stride;
    if (n > 8) {
      ScoreTokens<16>(codes, tokens, dim, Grouped<16>(q16, dim, grouped), step, wide, wide_q, n, s, stride);
    } else if (n > 4) {
      ScoreTokens<8>(codes, tokens, dim, Grouped<8>(q16, dim, grouped), step, wide, wide_q, n, s, stride);
    } else {
      ScoreTokens<4>(codes, tokens, dim, Grouped<4>(q16, dim, grouped), step, wide, wide_q, n, s, stride);
    }
  }
}

KVTIER_VNNI void Int8BlockWeightedSum(const uint8_t* payload, uint32_t tokens, uint32_t dim, uint32_t kv,
                                      uint32_t heads, const float* p, size_t stride, float* out) {
  const std::vector<float> scale = Scales(payload, dim);
  const auto* codes = reinterpret_cast<const int8_t*>(payload + 2 * size_t{dim});
  // Tokens go in pairs: vpdpwssd adds p_a*code_a + p_b*code_b per channel.
  // A span of at most 128 pairs keeps int32 sums below 2^31 (each pair adds
  // at most 2 * 32767 * 128); the weights are rounded per span and head.
  constexpr uint32_t kSpanPairs = 128, kChunk = 4;  // 4 x 16 channels at a time
  const std::vector<int8_t> zeros(dim, 0);
  std::vector<int16_t> widened(size_t{kSpanPairs} * kChunk * 32);  // [pair][chunk] x 32 int16
  std::vector<int16_t> p16(2 * size_t{kSpanPairs});
  std::vector<int32_t> pairs(size_t{heads} * kSpanPairs);
  std::vector<float> step(heads);
  for (uint32_t t0 = 0; t0 < tokens; t0 += 2 * kSpanPairs) {
    const uint32_t span = std::min(2 * kSpanPairs, tokens - t0), npairs = (span + 1) / 2;
    for (uint32_t h = 0; h < heads; ++h) {
      std::fill(p16.begin(), p16.end(), int16_t{0});
      step[h] = ToInt16(p + size_t{h} * stride + t0, nullptr, span, p16.data());
      for (uint32_t k = 0; k < npairs; ++k) {
        pairs[size_t{h} * kSpanPairs + k] =
            static_cast<int32_t>(static_cast<uint16_t>(p16[2 * k]) | static_cast<uint32_t>(static_cast<uint16_t>(p16[2 * k + 1])) << 16);
      }
    }
    for (uint32_t c0 = 0; c0 < kv; c0 += 16 * kChunk) {
      const uint32_t chunk = std::min(kChunk, (kv - c0) / 16);
      // Codes of token pairs, interleaved per channel and widened to int16:
      // lanes (code_a[c], code_b[c]) for 16 channels; shared by all heads.
      for (uint32_t k = 0; k < npairs; ++k) {
        const int8_t* a = codes + size_t{t0 + 2 * k} * dim;
        const int8_t* b = 2 * k + 1 < span ? a + dim : zeros.data();
        int16_t* w = widened.data() + size_t{k} * kChunk * 32;
        for (uint32_t j = chunk; j < kChunk; ++j) _mm512_storeu_si512(w + 32 * j, _mm512_setzero_si512());
        for (uint32_t j = 0; j < chunk; ++j) {
          const __m128i xa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + c0 + 16 * j));
          const __m128i xb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + c0 + 16 * j));
          const __m256i both = _mm256_set_m128i(_mm_unpackhi_epi8(xa, xb), _mm_unpacklo_epi8(xa, xb));
          _mm512_storeu_si512(w + 32 * j, _mm512_cvtepi8_epi16(both));
        }
      }
      for (uint32_t h = 0; h < heads; ++h) {
        __m512i acc[kChunk];
        for (auto& x : acc) x = _mm512_setzero_si512();
        const int32_t* ph = pairs.data() + size_t{h} * kSpanPairs;
        for (uint32_t k = 0; k < npairs; ++k) {
          const __m512i pp = _mm512_set1_epi32(ph[k]);
          const int16_t* w = widened.data() + size_t{k} * kChunk * 32;
          for (uint32_t j = 0; j < kChunk; ++j) acc[j] = _mm512_dpwssd_epi32(acc[j], pp, _mm512_loadu_si512(w + 32 * j));
        }
        // out += step * scale_c * sum
        const __m512 hs = _mm512_set1_ps(step[h]);
        for (uint32_t j = 0; j < chunk; ++j) {
          float* o = out + size_t{h} * kv + c0 + 16 * j;
          const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(scale.data() + c0 + 16 * j), hs);
          _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[j]), s, _mm512_loadu_ps(o)));
        }
      }
    }
  }
}

#else  // no AVX-512 VNNI in this compiler's target: the float path only

bool Int8VnniUsable(uint32_t, uint32_t) { return false; }
void Int8BlockScores(const uint8_t*, uint32_t, uint32_t, uint32_t, const float*, float*, size_t) {}
void Int8BlockWeightedSum(const uint8_t*, uint32_t, uint32_t, uint32_t, uint32_t, const float*, size_t, float*) {}

#endif

}  // namespace kvtier::kernels::cpu
