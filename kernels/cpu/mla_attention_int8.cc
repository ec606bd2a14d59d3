#include "mla_attention_int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "avx512.h"
#include "codec_internal.h"
#include "kvtier/kernels/float_formats.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define KVTIER_VNNI __attribute__((target("arch=x86-64-v4,avx512vnni")))
#endif

namespace kvtier::kernels::cpu {

#ifdef KVTIER_VNNI

bool Int8VnniUsable(uint32_t dim, uint32_t kv_lora_rank) {
  static const bool cpu = HasAvx512() && __builtin_cpu_supports("avx512vnni");
  return cpu && dim % 32 == 0 && kv_lora_rank % 16 == 0 && dim <= 8192;
}

namespace {

constexpr float kInt16Max = 32767.0f;

// Rounds x[i] for i < n to int16 with one scale (max |x| -> 32767) into
// runs of 32 that lie `run_stride` apart in `out` (32: one after another);
// returns the value of one int16 step.
KVTIER_VNNI float ToInt16(const float* x, size_t n, int16_t* out, size_t run_stride = 32) {
  __m512 max = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    max = _mm512_max_ps(max, _mm512_abs_ps(_mm512_maskz_loadu_ps(TailMask(n, i), x + i)));
  }
  const float top = _mm512_reduce_max_ps(max);
  // Round to nearest even (the default mode), then narrow; |v| <= 32767.
  const __m512 to_int = _mm512_set1_ps(top == 0.0f ? 0.0f : kInt16Max / top);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n, i);
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), to_int));
    _mm256_mask_storeu_epi16(out + i / 32 * run_stride + i % 32, m, _mm512_cvtsepi32_epi16(v));
  }
  return top / kInt16Max;
}

// The block's widest channels (largest scales) are multiplied in float:
// one outlier channel would otherwise set the int16 step of every query
// (measured: errors of 1.4e-4 against float64 with a 20x outlier channel).
constexpr uint32_t kFloatChannels = 4;

// Both passes work in tiles of 16 int32 sums kept in registers, each load
// shared by 4 vpdpwssd: 4 heads x 4 tokens for the scores, 4 heads x 64
// channels for the weighted sums (a load a product, with 16 heads a token,
// had the load ports, not the multiply-adds, set the pace). Heads go in
// groups of 4, the last one padded with zero queries or weights whose
// results are not written.
constexpr uint32_t kGroup = 4;

// Buffers kept per thread between blocks (a decode step calls these once
// a block): grown, never shrunk or cleared.
struct Scratch {
  std::vector<float> scale, qs, step, wide_q, wide_codes;
  std::vector<int16_t> q16, p16, widened;
  std::vector<int8_t> zeros;
};

template <typename T>
T* Sized(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// The block's per-channel scales (bf16, before the codes) as floats; dim
// is a multiple of 32.
KVTIER_VNNI const float* Scales(const uint8_t* payload, uint32_t dim, Scratch& s) {
  float* scale = Sized(s.scale, dim);
  for (uint32_t c = 0; c < dim; c += 16) _mm512_storeu_ps(scale + c, Bf16ToFloats(payload + 2 * c));
  return scale;
}

// The kFloatChannels channels of largest |scale|, largest first (the
// lower channel on ties).
void WidestChannels(const float* scale, uint32_t dim, uint32_t* wide) {
  float width[kFloatChannels];
  uint32_t found = 0;
  for (uint32_t c = 0; c < dim; ++c) {
    const float w = std::fabs(scale[c]);
    if (found == kFloatChannels && !(w > width[kFloatChannels - 1])) continue;
    uint32_t i = std::min(found, kFloatChannels - 1);
    for (; i > 0 && w > width[i - 1]; --i) width[i] = width[i - 1], wide[i] = wide[i - 1];
    width[i] = w, wide[i] = c;
    found = std::min(found + 1, kFloatChannels);
  }
}

// vpdpwssd as an asm that updates its accumulator in place: through the
// intrinsic GCC 12 still copied some of the named accumulators between
// registers on every step.
#define KVTIER_TILE_ZERO(h, k) __m512i a##h##k = _mm512_setzero_si512();
#define KVTIER_TILE_FLOAT(h, k) _mm512_cvtepi32_ps(a##h##k),
#define KVTIER_TILE_DPWSSD(h, k) asm("vpdpwssd %2, %1, %0" : "+v"(a##h##k) : "v"(row), "v"(c##k));

// Sums of one 4-head x 4-token tile, lane h * 4 + k for head h and token
// k: q16[h] . code[k] over all channel groups, q16 as [dim / 32][4][32].
KVTIER_VNNI __attribute__((noinline)) __m512 ScoreTile(const int8_t* const rows[kGroup], const int16_t* qg,
                                                       uint32_t dim) {
  KVTIER_TILE(KVTIER_TILE_ZERO)
  for (uint32_t g = 0; g < dim / 32; ++g) {
#define KVTIER_CODES(k) _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[k] + 32 * g)))
#define KVTIER_QUERY(h) _mm512_loadu_si512(qg + (size_t{g} * kGroup + h) * 32)
    KVTIER_TILE_STEP(__m512i, KVTIER_CODES, KVTIER_QUERY, KVTIER_TILE_DPWSSD)
#undef KVTIER_CODES
#undef KVTIER_QUERY
  }
  const __m512 sums[16] = {KVTIER_TILE(KVTIER_TILE_FLOAT)};
  return SumEach(sums);
}

// Two int16 weights (tokens 2k and 2k + 1) as the int32 vpdpwssd pairs
// with the two tokens' codes.
KVTIER_VNNI inline __m512i WeightPair(const int16_t* p16, uint32_t k) {
  int32_t both;
  std::memcpy(&both, p16 + 2 * size_t{k}, sizeof both);
  return _mm512_set1_epi32(both);
}

// Sums of one 4-head x 64-channel tile over the span's token pairs:
// out[h * 4 + j] = sum_k (p16[h][2k], p16[h][2k+1]) . widened[k][j], p16
// as [head][2 * npairs], widened as [pair][4 chunks][32].
KVTIER_VNNI __attribute__((noinline)) void WeightedTile(const int16_t* p16, const int16_t* widened, uint32_t npairs,
                                                        __m512i out[16]) {
  KVTIER_TILE(KVTIER_TILE_ZERO)
  for (uint32_t k = 0; k < npairs; ++k) {
#define KVTIER_CODES(j) _mm512_loadu_si512(widened + (size_t{k} * 4 + j) * 32)
#define KVTIER_WEIGHTS(h) WeightPair(p16 + size_t{h} * 2 * npairs, k)
    KVTIER_TILE_STEP(__m512i, KVTIER_CODES, KVTIER_WEIGHTS, KVTIER_TILE_DPWSSD)
#undef KVTIER_CODES
#undef KVTIER_WEIGHTS
  }
  const __m512i sums[16] = {KVTIER_TILE(KVTIER_TILE_LIST)};
  std::copy_n(sums, 16, out);
}

}  // namespace

KVTIER_VNNI void Int8BlockScores(const uint8_t* payload, uint32_t tokens, uint32_t dim, uint32_t heads, const float* q,
                                 float* scores, size_t stride) {
  Scratch& s = ThreadScratch();
  const float* scale = Scales(payload, dim, s);
  const auto* codes = reinterpret_cast<const int8_t*>(payload + 2 * size_t{dim});
  uint32_t wide[kFloatChannels];
  WidestChannels(scale, dim, wide);
  // Queries with the scales folded in, as int16 without the float channels
  // (one step each), laid out [head group][dim / 32][4 heads][32].
  const uint32_t groups = (heads + kGroup - 1) / kGroup, padded = groups * kGroup;
  int16_t* q16 = Sized(s.q16, size_t{padded} * dim);
  float* qs = Sized(s.qs, dim);
  float* step = Sized(s.step, padded);
  float* wide_q = Sized(s.wide_q, size_t{padded} * kFloatChannels);
  for (uint32_t h = 0; h < padded; ++h) {
    if (h < heads) {
      for (uint32_t c = 0; c < dim; ++c) qs[c] = q[size_t{h} * dim + c] * scale[c];
      for (uint32_t j = 0; j < kFloatChannels; ++j) {
        wide_q[h * kFloatChannels + j] = qs[wide[j]];
        qs[wide[j]] = 0.0f;
      }
    } else {
      std::fill(qs, qs + dim, 0.0f);
    }
    int16_t* grouped = q16 + size_t{h / kGroup} * kGroup * dim + (h % kGroup) * 32;
    step[h] = ToInt16(qs, dim, grouped, kGroup * 32);
  }
  // Integer sums, 4 tokens (rows past the block read zeros) by 4 heads.
  const int8_t* zeros = Sized(s.zeros, dim);
  for (uint32_t t0 = 0; t0 < tokens; t0 += kGroup) {
    const uint32_t n = std::min(kGroup, tokens - t0);
    const int8_t* rows[kGroup];
    for (uint32_t k = 0; k < kGroup; ++k) rows[k] = k < n ? codes + size_t{t0 + k} * dim : zeros;
    for (uint32_t group = 0; group < groups; ++group) {
      StoreTileRows(ScoreTile(rows, q16 + size_t{group} * kGroup * dim, dim), std::min(kGroup, heads - group * kGroup),
                    n, scores + size_t{group * kGroup} * stride + t0, stride);
    }
  }
  // Scores: the sums times each head's step, plus the float channels.
  float* wide_codes = Sized(s.wide_codes, size_t{kFloatChannels} * tokens);
  for (uint32_t j = 0; j < kFloatChannels; ++j)
    for (uint32_t t = 0; t < tokens; ++t) wide_codes[size_t{j} * tokens + t] = codes[size_t{t} * dim + wide[j]];
  for (uint32_t h = 0; h < heads; ++h) {
    float* sh = scores + size_t{h} * stride;
    const __m512 hs = _mm512_set1_ps(step[h]);
    for (uint32_t t = 0; t < tokens; t += 16) {
      const __mmask16 m = TailMask(tokens, t);
      __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sh + t), hs);
      for (uint32_t j = 0; j < kFloatChannels; ++j) {
        v = _mm512_fmadd_ps(_mm512_set1_ps(wide_q[h * kFloatChannels + j]),
                            _mm512_maskz_loadu_ps(m, wide_codes + size_t{j} * tokens + t), v);
      }
      _mm512_mask_storeu_ps(sh + t, m, v);
    }
  }
}

KVTIER_VNNI void Int8BlockWeightedSum(const uint8_t* payload, uint32_t tokens, uint32_t dim, uint32_t kv,
                                      uint32_t heads, const float* p, size_t stride, float* out) {
  Scratch& s = ThreadScratch();
  const float* scale = Scales(payload, dim, s);
  const auto* codes = reinterpret_cast<const int8_t*>(payload + 2 * size_t{dim});
  // Tokens go in pairs: vpdpwssd adds p_a*code_a + p_b*code_b per channel.
  // A span of at most 128 pairs keeps int32 sums below 2^31 (each pair adds
  // at most 2 * 32767 * 128); the weights are rounded per span and head.
  constexpr uint32_t kSpanPairs = 128, kChunk = 4;  // 4 x 16 channels at a time
  const uint32_t groups = (heads + kGroup - 1) / kGroup, padded = groups * kGroup;
  const int8_t* zeros = Sized(s.zeros, dim);
  int16_t* widened = Sized(s.widened, size_t{kSpanPairs} * kChunk * 32);  // [pair][chunk] x 32 int16
  int16_t* p16 = Sized(s.p16, size_t{padded} * 2 * kSpanPairs);           // [head][2 * npairs]
  float* step = Sized(s.step, padded);
  for (uint32_t t0 = 0; t0 < tokens; t0 += 2 * kSpanPairs) {
    const uint32_t span = std::min(2 * kSpanPairs, tokens - t0), npairs = (span + 1) / 2;
    for (uint32_t h = 0; h < padded; ++h) {
      int16_t* ph = p16 + size_t{h} * 2 * npairs;
      ph[2 * npairs - 1] = 0;  // an odd span's last pair has one token
      if (h < heads) {
        step[h] = ToInt16(p + size_t{h} * stride + t0, span, ph);
      } else {
        std::fill(ph, ph + 2 * npairs, int16_t{0});
        step[h] = 0.0f;
      }
    }
    for (uint32_t c0 = 0; c0 < kv; c0 += 16 * kChunk) {
      const uint32_t chunk = std::min(kChunk, (kv - c0) / 16);
      // Codes of token pairs, interleaved per channel and widened to int16:
      // lanes (code_a[c], code_b[c]) for 16 channels; shared by all heads.
      for (uint32_t k = 0; k < npairs; ++k) {
        const int8_t* a = codes + size_t{t0 + 2 * k} * dim;
        const int8_t* b = 2 * k + 1 < span ? a + dim : zeros;
        int16_t* w = widened + size_t{k} * kChunk * 32;
        for (uint32_t j = chunk; j < kChunk; ++j) _mm512_storeu_si512(w + 32 * j, _mm512_setzero_si512());
        for (uint32_t j = 0; j < chunk; ++j) {
          const __m128i xa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + c0 + 16 * j));
          const __m128i xb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + c0 + 16 * j));
          const __m256i both = _mm256_set_m128i(_mm_unpackhi_epi8(xa, xb), _mm_unpacklo_epi8(xa, xb));
          _mm512_storeu_si512(w + 32 * j, _mm512_cvtepi8_epi16(both));
        }
      }
      for (uint32_t group = 0; group < groups; ++group) {
        __m512i acc[kGroup * kChunk];  // [head][chunk]
        WeightedTile(p16 + size_t{group} * kGroup * 2 * npairs, widened, npairs, acc);
        // out += step * scale_c * sum
        for (uint32_t h = 0; h < kGroup && group * kGroup + h < heads; ++h) {
          const __m512 hs = _mm512_set1_ps(step[group * kGroup + h]);
          for (uint32_t j = 0; j < chunk; ++j) {
            float* o = out + size_t{group * kGroup + h} * kv + c0 + 16 * j;
            const __m512 sc = _mm512_mul_ps(_mm512_loadu_ps(scale + c0 + 16 * j), hs);
            _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[h * kChunk + j]), sc, _mm512_loadu_ps(o)));
          }
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
