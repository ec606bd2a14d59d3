#include "mla_attention_int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "avx512.h"
#include "codec_internal.h"
#include "kvtier/kernels/float_formats.h"
#include "scratch.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define KVTIER_VNNI __attribute__((target("arch=x86-64-v4,avx512vnni")))
#endif

namespace kvtier::kernels::cpu {

#ifdef KVTIER_VNNI

namespace {

bool HasVnni() {
  static const bool cpu = HasAvx512() && __builtin_cpu_supports("avx512vnni");
  return cpu;
}

constexpr float kInt16Max = 32767.0f;

// Rounds x[i] for i < n to int16 with one scale (max |x| -> 32767) into
// runs of 32 that lie `run_stride` apart in `out` (32: one after another);
// returns the value of one int16 step.
KVTIER_VNNI float ToInt16(const float* x, size_t n, int16_t* out, size_t run_stride) {
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

// Groups of kGroup heads, the last one padded.
constexpr uint32_t HeadGroups(uint32_t heads) { return (heads + kGroup - 1) / kGroup; }

// Buffers kept per thread between blocks (a decode step calls these once
// a block): grown, never shrunk or cleared.
struct Scratch {
  std::vector<float> scale, qs, step, wide_q, wide_codes;
  std::vector<int16_t> q16, p16, widened;
  std::vector<int8_t> zeros;
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
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

// The weighted sums take tokens in pairs (p_a*code_a + p_b*code_b per
// channel and int32 lane): a span of at most 128 pairs keeps the sums
// below 2^31 (each pair adds at most 2 * 32767 * 128); the weights are
// rounded per span and head. Channels go 4 x 16 at a time.
constexpr uint32_t kSpanPairs = 128, kChunk = 4;

// A head's weights rounded to int16 by ToInt16 or ToInt16Avx2.
using RoundToInt16 = float (*)(const float* x, size_t n, int16_t* out, size_t run_stride);

// Each head's weights of tokens t0..t0 + span - 1 rounded by `round` into
// p16 as [head][2 * npairs] (an odd span's last pair padded with 0), and
// their steps; padding heads (h >= heads) all 0.
void RoundWeights(RoundToInt16 round, const float* p, size_t stride, uint32_t t0, uint32_t span, uint32_t heads,
                  uint32_t padded, int16_t* p16, float* step) {
  const uint32_t npairs = (span + 1) / 2;
  for (uint32_t h = 0; h < padded; ++h) {
    int16_t* ph = p16 + size_t{h} * 2 * npairs;
    ph[2 * npairs - 1] = 0;
    if (h < heads) {
      step[h] = round(p + size_t{h} * stride + t0, span, ph, 32);
    } else {
      std::fill(ph, ph + 2 * npairs, int16_t{0});
      step[h] = 0.0f;
    }
  }
}

// One block's queries for its scores: each head's with the block's
// scales folded in, its widest channels apart as floats (wide_q) and the
// rest rounded by `round` to int16 with one step a head, laid out [head
// group][dim / 32][4 heads][32]; padding heads all 0.
struct RoundedQueries {
  uint32_t wide[kFloatChannels];
  const int16_t* q16;
  const float* step;    // [padded heads]
  const float* wide_q;  // [padded heads][kFloatChannels]
};
RoundedQueries RoundQueries(RoundToInt16 round, const float* q, const float* scale, uint32_t heads, uint32_t dim,
                            Scratch& s) {
  RoundedQueries r;
  WidestChannels(scale, dim, r.wide);
  const uint32_t padded = HeadGroups(heads) * kGroup;
  int16_t* q16 = Sized(s.q16, size_t{padded} * dim);
  float* qs = Sized(s.qs, dim);
  float* step = Sized(s.step, padded);
  float* wide_q = Sized(s.wide_q, size_t{padded} * kFloatChannels);
  for (uint32_t h = 0; h < padded; ++h) {
    if (h < heads) {
      for (uint32_t c = 0; c < dim; ++c) qs[c] = q[size_t{h} * dim + c] * scale[c];
      for (uint32_t j = 0; j < kFloatChannels; ++j) {
        wide_q[h * kFloatChannels + j] = qs[r.wide[j]];
        qs[r.wide[j]] = 0.0f;
      }
    } else {
      std::fill(qs, qs + dim, 0.0f);
    }
    step[h] = round(qs, dim, q16 + size_t{h / kGroup} * kGroup * dim + (h % kGroup) * 32, kGroup * 32);
  }
  r.q16 = q16, r.step = step, r.wide_q = wide_q;
  return r;
}

// The block's per-channel scales (bf16, before the codes), `n` of them.
float* ScalesOf(const uint8_t* payload, uint32_t n, Scratch& s) {
  float* scale = Sized(s.scale, n);
  for (uint32_t c = 0; c < n; ++c) scale[c] = Bf16ToFloat(LoadU16(payload + 2 * size_t{c}));
  return scale;
}

// The codes of the widest channels as floats, [channel][token].
float* WideCodes(const int8_t* codes, uint32_t tokens, uint32_t dim, const uint32_t wide[kFloatChannels], Scratch& s) {
  float* wide_codes = Sized(s.wide_codes, size_t{kFloatChannels} * tokens);
  for (uint32_t j = 0; j < kFloatChannels; ++j)
    for (uint32_t t = 0; t < tokens; ++t) wide_codes[size_t{j} * tokens + t] = codes[size_t{t} * dim + wide[j]];
  return wide_codes;
}

// The codes of `span` tokens' channels c0..c0 + 16 * chunk - 1 for the
// weighted sums, shared by all heads: per token pair and 16 channels,
// (code_a[c], code_b[c]) as int16 for channels 0..7 then 8..15 (an odd
// span's last token paired with `zeros`), as [pair][kChunk][32], the
// chunks past `chunk` 0. AVX2 code: the VNNI path takes it too.
KVTIER_AVX2 void WidenPairs(const int8_t* codes, uint32_t span, uint32_t dim, uint32_t c0, uint32_t chunk,
                            const int8_t* zeros, int16_t* widened) {
  for (uint32_t k = 0; 2 * k < span; ++k) {
    const int8_t* a = codes + size_t{2 * k} * dim;
    const int8_t* b = 2 * k + 1 < span ? a + dim : zeros;
    int16_t* w = widened + size_t{k} * kChunk * 32;
    for (uint32_t j = 0; j < kChunk; ++j) {
      __m256i low = _mm256_setzero_si256(), high = _mm256_setzero_si256();
      if (j < chunk) {
        const __m128i xa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + c0 + 16 * j));
        const __m128i xb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + c0 + 16 * j));
        low = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(xa, xb));
        high = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(xa, xb));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + 32 * j), low);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + 32 * j + 16), high);
    }
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

// The VNNI path's score sums: 4 tokens (rows past the block read zeros)
// by 4 heads a tile.
KVTIER_VNNI void ScoreSumsVnni(const int8_t* codes, uint32_t tokens, uint32_t dim, uint32_t heads, const int16_t* q16,
                               const int8_t* zeros, float* scores, size_t stride) {
  const uint32_t groups = HeadGroups(heads);
  for (uint32_t t0 = 0; t0 < tokens; t0 += kGroup) {
    const uint32_t n = std::min(kGroup, tokens - t0);
    const int8_t* rows[kGroup];
    for (uint32_t k = 0; k < kGroup; ++k) rows[k] = k < n ? codes + size_t{t0 + k} * dim : zeros;
    for (uint32_t group = 0; group < groups; ++group) {
      StoreTileRows(ScoreTile(rows, q16 + size_t{group} * kGroup * dim, dim), std::min(kGroup, heads - group * kGroup),
                    n, scores + size_t{group * kGroup} * stride + t0, stride);
    }
  }
}

// The VNNI path's weighted sums of one chunk of channels (c0 on) over one
// span: 4 heads x 64 channels a tile.
KVTIER_VNNI void AddWeightedVnni(const int16_t* p16, const int16_t* widened, uint32_t npairs, const float* step,
                                 const float* scale, uint32_t heads, uint32_t kv, uint32_t c0, uint32_t chunk,
                                 float* out) {
  const uint32_t groups = HeadGroups(heads);
  for (uint32_t group = 0; group < groups; ++group) {
    __m512i acc[kGroup * kChunk];  // [head][chunk]
    WeightedTile(p16 + size_t{group} * kGroup * 2 * npairs, widened, npairs, acc);
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

// Without VNNI, AVX2's vpmaddwd: 16 int16 multiply-adds in pairs into 8
// int32 lanes, then an add. The same roundings as above (so the same
// bound); tiles of 4 heads x 2 tokens and 4 heads x 16 channels, 8
// accumulators of the 16 registers, named variables (as an array GCC
// moved them between registers and the stack on every step), each load
// pinned to a register (GCC otherwise folds it into each multiply-add
// that uses it, a load each). A lane sums dim / 8 products, each at most
// 32767 x 128: dim <= 4096 keeps it below 2^31.

// ToInt16's rounding, 8 lanes at a time (any n).
KVTIER_AVX2 float ToInt16Avx2(const float* x, size_t n, int16_t* out, size_t run_stride) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 max = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) max = _mm256_max_ps(max, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, max);
  float top = *std::max_element(lanes, lanes + 8);
  for (; i < n; ++i) top = std::max(top, std::fabs(x[i]));
  const float to_int = top == 0.0f ? 0.0f : kInt16Max / top;
  const __m256 scale = _mm256_set1_ps(to_int);
  for (i = 0; i + 16 <= n; i += 16) {
    const __m256i low = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), scale));
    const __m256i high = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), scale));
    // packs works within 128-bit lanes: put the four quarters back in order.
    const __m256i both = _mm256_permute4x64_epi64(_mm256_packs_epi32(low, high), _MM_SHUFFLE(3, 1, 2, 0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i / 32 * run_stride + i % 32), both);
  }
  for (; i < n; ++i) out[i / 32 * run_stride + i % 32] = static_cast<int16_t>(std::lrint(x[i] * to_int));
  return top / kInt16Max;
}

// 16 int8 codes widened to int16.
KVTIER_AVX2 inline __m256i WidenCodes(const int8_t* codes) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
}

constexpr uint32_t kAvx2Tokens = 2;

#define KVTIER_INT8_SUMS(X) X(0, 0) X(0, 1) X(1, 0) X(1, 1) X(2, 0) X(2, 1) X(3, 0) X(3, 1)
#define KVTIER_INT8_ZERO(h, k) __m256i a##h##k = _mm256_setzero_si256();
#define KVTIER_INT8_FLOATS(h, k) _mm256_cvtepi32_ps(a##h##k),
#define KVTIER_INT8_LIST(h, k) a##h##k,

// Sums of one 4-head x 2-token tile, sums[h * 2 + k] = q16[h] . code[k],
// q16 as [dim / 32][4][32], 16 channels a step (GCC unrolling the two
// steps of a group spilled sums to the stack).
KVTIER_AVX2 __attribute__((noinline)) void ScoreTileAvx2(const int8_t* const rows[kAvx2Tokens], const int16_t* qg,
                                                         uint32_t dim, float sums[8]) {
  KVTIER_INT8_SUMS(KVTIER_INT8_ZERO)
  for (uint32_t g = 0; g < dim; g += 32) {
    const int16_t* qg32 = qg + size_t{g} * kGroup;  // the group's [4][32]
#pragma GCC unroll 1
    for (uint32_t c = g; c < g + 32; c += 16) {
      const __m256i t0 = WidenCodes(rows[0] + c), t1 = WidenCodes(rows[1] + c);
      const int16_t* q = qg32 + (c - g);
#define KVTIER_INT8_HEAD(h)                                                          \
  {                                                                                  \
    __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * (h))); \
    asm("" : "+x"(qh));                                                              \
    a##h##0 = _mm256_add_epi32(a##h##0, _mm256_madd_epi16(t0, qh));                  \
    a##h##1 = _mm256_add_epi32(a##h##1, _mm256_madd_epi16(t1, qh));                  \
  }
      KVTIER_INT8_HEAD(0) KVTIER_INT8_HEAD(1) KVTIER_INT8_HEAD(2) KVTIER_INT8_HEAD(3)
#undef KVTIER_INT8_HEAD
    }
  }
  const __m256 all[8] = {KVTIER_INT8_SUMS(KVTIER_INT8_FLOATS)};
  _mm256_storeu_ps(sums, SumEach8(all));
}

// The AVX2 path's score sums: 2 tokens (a row past the block reads
// zeros) by 4 heads a tile.
KVTIER_AVX2 void ScoreSumsAvx2(const int8_t* codes, uint32_t tokens, uint32_t dim, uint32_t heads, const int16_t* q16,
                               const int8_t* zeros, float* scores, size_t stride) {
  const uint32_t groups = HeadGroups(heads);
  for (uint32_t t0 = 0; t0 < tokens; t0 += kAvx2Tokens) {
    const uint32_t n = std::min(kAvx2Tokens, tokens - t0);
    const int8_t* rows[kAvx2Tokens];
    for (uint32_t k = 0; k < kAvx2Tokens; ++k) rows[k] = k < n ? codes + size_t{t0 + k} * dim : zeros;
    for (uint32_t group = 0; group < groups; ++group) {
      float lanes[2 * kGroup];
      ScoreTileAvx2(rows, q16 + size_t{group} * kGroup * dim, dim, lanes);
      for (uint32_t h = 0; h < kGroup && group * kGroup + h < heads; ++h) {
        std::copy_n(lanes + kAvx2Tokens * h, n, scores + size_t{group * kGroup + h} * stride + t0);
      }
    }
  }
}

// One 4-head x 16-channel tile over the span's token pairs: sums[h * 2 +
// half] for the tile's channels 8 * half..8 * half + 7; `widened` is the
// tile's 32 int16 of pair 0, the next pair's `pair_stride` further.
KVTIER_AVX2 __attribute__((noinline)) void WeightedTileAvx2(const int16_t* p16, const int16_t* widened, uint32_t npairs,
                                                            size_t pair_stride, __m256i sums[2 * kGroup]) {
  KVTIER_INT8_SUMS(KVTIER_INT8_ZERO)
  for (uint32_t k = 0; k < npairs; ++k) {
    const int16_t* w = widened + k * pair_stride;
    __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
    asm("" : "+x"(low), "+x"(high));
#define KVTIER_INT8_HEAD(h)                                                        \
  {                                                                                \
    int32_t pair;                                                                  \
    std::memcpy(&pair, p16 + size_t{h} * 2 * npairs + 2 * size_t{k}, sizeof pair); \
    const __m256i weights = _mm256_set1_epi32(pair);                               \
    a##h##0 = _mm256_add_epi32(a##h##0, _mm256_madd_epi16(low, weights));          \
    a##h##1 = _mm256_add_epi32(a##h##1, _mm256_madd_epi16(high, weights));         \
  }
    KVTIER_INT8_HEAD(0) KVTIER_INT8_HEAD(1) KVTIER_INT8_HEAD(2) KVTIER_INT8_HEAD(3)
#undef KVTIER_INT8_HEAD
  }
  const __m256i all[2 * kGroup] = {KVTIER_INT8_SUMS(KVTIER_INT8_LIST)};
  std::copy_n(all, 2 * kGroup, sums);
}

// The AVX2 path's weighted sums of one chunk of channels (c0 on) over one
// span: 4 heads x 16 channels a tile.
KVTIER_AVX2 void AddWeightedAvx2(const int16_t* p16, const int16_t* widened, uint32_t npairs, const float* step,
                                 const float* scale, uint32_t heads, uint32_t kv, uint32_t c0, uint32_t chunk,
                                 float* out) {
  const uint32_t groups = HeadGroups(heads);
  for (uint32_t group = 0; group < groups; ++group) {
    for (uint32_t j = 0; j < chunk; ++j) {
      __m256i sums[2 * kGroup];
      WeightedTileAvx2(p16 + size_t{group} * kGroup * 2 * npairs, widened + 32 * j, npairs, kChunk * 32, sums);
      for (uint32_t h = 0; h < kGroup && group * kGroup + h < heads; ++h) {
        const __m256 hs = _mm256_set1_ps(step[group * kGroup + h]);
        float* o = out + size_t{group * kGroup + h} * kv + c0 + 16 * j;
        for (uint32_t half = 0; half < 2; ++half) {
          const __m256 sc = _mm256_mul_ps(_mm256_loadu_ps(scale + c0 + 16 * j + 8 * half), hs);
          _mm256_storeu_ps(o + 8 * half,
                           _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[2 * h + half]), sc, _mm256_loadu_ps(o + 8 * half)));
        }
      }
    }
  }
}

// Scores: each head's integer sums times its step, plus its float
// channels' products (AVX2 code: the VNNI path takes it too).
KVTIER_AVX2 void ApplySteps(const RoundedQueries& r, const float* wide_codes, uint32_t tokens, uint32_t heads,
                            float* scores, size_t stride) {
  for (uint32_t h = 0; h < heads; ++h) {
    float* sh = scores + size_t{h} * stride;
    for (uint32_t t = 0; t < tokens; ++t) {
      float v = sh[t] * r.step[h];
      for (uint32_t j = 0; j < kFloatChannels; ++j) {
        v = std::fma(r.wide_q[h * kFloatChannels + j], wide_codes[size_t{j} * tokens + t], v);
      }
      sh[t] = v;
    }
  }
}

// What each instruction set does its own way; the passes below are the
// same for both.
struct IntegerPath {
  RoundToInt16 round;
  // Every head's integer sums q16[h] . code[t], unscaled, into scores.
  void (*score_sums)(const int8_t* codes, uint32_t tokens, uint32_t dim, uint32_t heads, const int16_t* q16,
                     const int8_t* zeros, float* scores, size_t stride);
  // out += step * scale_c * sum over one span, for channels c0 to
  // c0 + 16 * chunk of every head.
  void (*add_weighted)(const int16_t* p16, const int16_t* widened, uint32_t npairs, const float* step,
                       const float* scale, uint32_t heads, uint32_t kv, uint32_t c0, uint32_t chunk, float* out);
};

const IntegerPath& Path() {
  static const IntegerPath vnni{ToInt16, ScoreSumsVnni, AddWeightedVnni};
  static const IntegerPath avx2{ToInt16Avx2, ScoreSumsAvx2, AddWeightedAvx2};
  return HasVnni() ? vnni : avx2;
}

}  // namespace

bool Int8IntegerUsable(uint32_t dim, uint32_t kv_lora_rank) {
  if (dim % 32 != 0 || kv_lora_rank % 16 != 0) return false;
  return HasVnni() ? dim <= 8192 : HasAvx2() && dim <= 4096;
}

void Int8BlockScores(const uint8_t* payload, uint32_t tokens, uint32_t dim, uint32_t heads, const float* q,
                     float* scores, size_t stride) {
  const IntegerPath& path = Path();
  Scratch& s = ThreadScratch();
  const auto* codes = reinterpret_cast<const int8_t*>(payload + 2 * size_t{dim});
  const RoundedQueries r = RoundQueries(path.round, q, ScalesOf(payload, dim, s), heads, dim, s);
  path.score_sums(codes, tokens, dim, heads, r.q16, Sized(s.zeros, dim), scores, stride);
  ApplySteps(r, WideCodes(codes, tokens, dim, r.wide, s), tokens, heads, scores, stride);
}

void Int8BlockWeightedSum(const uint8_t* payload, uint32_t tokens, uint32_t dim, uint32_t kv, uint32_t heads,
                          const float* p, size_t stride, float* out) {
  const IntegerPath& path = Path();
  Scratch& s = ThreadScratch();
  const float* scale = ScalesOf(payload, kv, s);
  const auto* codes = reinterpret_cast<const int8_t*>(payload + 2 * size_t{dim});
  const uint32_t padded = HeadGroups(heads) * kGroup;
  const int8_t* zeros = Sized(s.zeros, dim);
  int16_t* widened = Sized(s.widened, size_t{kSpanPairs} * kChunk * 32);  // [pair][chunk] x 32 int16
  int16_t* p16 = Sized(s.p16, size_t{padded} * 2 * kSpanPairs);           // [head][2 * npairs]
  float* step = Sized(s.step, padded);
  for (uint32_t t0 = 0; t0 < tokens; t0 += 2 * kSpanPairs) {
    const uint32_t span = std::min(2 * kSpanPairs, tokens - t0), npairs = (span + 1) / 2;
    RoundWeights(path.round, p, stride, t0, span, heads, padded, p16, step);
    for (uint32_t c0 = 0; c0 < kv; c0 += 16 * kChunk) {
      const uint32_t chunk = std::min(kChunk, (kv - c0) / 16);
      WidenPairs(codes + size_t{t0} * dim, span, dim, c0, chunk, zeros, widened);
      path.add_weighted(p16, widened, npairs, step, scale, heads, kv, c0, chunk, out);
    }
  }
}

#else  // not x86-64 with GCC or clang: the float path only

bool Int8IntegerUsable(uint32_t, uint32_t) { return false; }
void Int8BlockScores(const uint8_t*, uint32_t, uint32_t, uint32_t, const float*, float*, size_t) {}
void Int8BlockWeightedSum(const uint8_t*, uint32_t, uint32_t, uint32_t, uint32_t, const float*, size_t, float*) {}

#endif

}  // namespace kvtier::kernels::cpu
