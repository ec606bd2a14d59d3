#include "mla_attention_float.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "avx512.h"
#include "codec_internal.h"
#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/layers.h"
#include "lanes16.h"
#include "scratch.h"

namespace kvtier::kernels::cpu {

#if defined(__x86_64__) && defined(__GNUC__)

bool FloatTilesUsable(uint32_t dim, uint32_t kv_lora_rank) {
  return (HasAvx512() || HasAvx2()) && dim % 16 == 0 && kv_lora_rank % 16 == 0;
}

namespace {

constexpr uint32_t kGroup = 4;

#define KVTIER_TILE_ZERO(h, k) __m512 a##h##k = _mm512_setzero_ps();
#define KVTIER_TILE_FMA(h, k) a##h##k = _mm512_fmadd_ps(row, c##k, a##h##k);

// 16 channels of a row as floats, lanes masked off 0: float rows as they
// lie, bf16 rows (a block's payload) widened in the register, so that a
// bf16 block is never written out as floats.
KVTIER_AVX512 __attribute__((always_inline)) inline __m512 LoadRow(const float* p, __mmask16 live) {
  return _mm512_maskz_loadu_ps(live, p);
}
KVTIER_AVX512 __attribute__((always_inline)) inline __m512 LoadRow(const uint16_t* p, __mmask16 live) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, p)), 16));
}

// Sums of one 4-head x 4-token tile, lane h * 4 + k: q[h] . token[k].
template <typename Row>
KVTIER_AVX512 __attribute__((noinline)) __m512 ScoreTile(const Row* const tokens[kGroup], const float* const q[kGroup],
                                                         uint32_t dim) {
  KVTIER_TILE(KVTIER_TILE_ZERO)
  for (uint32_t c = 0; c < dim; c += 16) {
#define KVTIER_TOKEN(k) LoadRow(tokens[k] + c, 0xffff)
#define KVTIER_QUERY(h) _mm512_loadu_ps(q[h] + c)
    KVTIER_TILE_STEP(__m512, KVTIER_TOKEN, KVTIER_QUERY, KVTIER_TILE_FMA)
#undef KVTIER_TOKEN
#undef KVTIER_QUERY
  }
  const __m512 sums[16] = {KVTIER_TILE(KVTIER_TILE_LIST)};
  return SumEach(sums);
}

// One 4-head x 64-channel tile over the block's tokens: out[h][c] +=
// sum_t p[h][t] * rows[t][c] for the first `chunks` 16-channel groups
// (p[h]: head h's weights; out[h]: its 64 outputs, null for a padding head).
// The groups past `chunks` are loaded masked off, so no row is read past
// them.
template <typename Row>
KVTIER_AVX512 __attribute__((noinline)) void WeightedTile(const Row* rows, uint32_t tokens, uint32_t dim,
                                                          const float* const p[kGroup], float* const out[kGroup],
                                                          uint32_t chunks) {
  __mmask16 live[kGroup];
  for (uint32_t j = 0; j < kGroup; ++j) live[j] = j < chunks ? 0xffff : 0;
  KVTIER_TILE(KVTIER_TILE_ZERO)
  for (uint32_t t = 0; t < tokens; ++t) {
#define KVTIER_CHANNELS(j) LoadRow(rows + size_t{t} * dim + 16 * j, live[j])
#define KVTIER_WEIGHT(h) _mm512_set1_ps(p[h][t])
    KVTIER_TILE_STEP(__m512, KVTIER_CHANNELS, KVTIER_WEIGHT, KVTIER_TILE_FMA)
#undef KVTIER_CHANNELS
#undef KVTIER_WEIGHT
  }
  const __m512 sums[16] = {KVTIER_TILE(KVTIER_TILE_LIST)};
  for (uint32_t h = 0; h < kGroup; ++h) {
    if (out[h] == nullptr) continue;
    for (uint32_t j = 0; j < chunks; ++j) {
      _mm512_storeu_ps(out[h] + 16 * j, _mm512_add_ps(_mm512_loadu_ps(out[h] + 16 * j), sums[h * kGroup + j]));
    }
  }
}

// The AVX2 tiles, in 16 registers of 8 floats: 4 heads x 3 tokens for the
// scores (12 sums, a load of each token and of one head at a time), 4
// heads x 16 channels for the weighted sums (8 sums, two row loads and one
// weight at a time).
constexpr uint32_t kAvx2Tokens = 3;

#define KVTIER_AVX2_SCORE_SUMS(X) \
  X(0, 0) X(0, 1) X(0, 2) X(1, 0) X(1, 1) X(1, 2) X(2, 0) X(2, 1) X(2, 2) X(3, 0) X(3, 1) X(3, 2)

#define KVTIER_AVX2_CHANNEL_SUMS(X) X(0, 0) X(0, 1) X(1, 0) X(1, 1) X(2, 0) X(2, 1) X(3, 0) X(3, 1)
#define KVTIER_AVX2_ZERO(h, k) __m256 a##h##k = _mm256_setzero_ps();
#define KVTIER_AVX2_LIST(h, k) a##h##k,

// LoadRow's 8 channels.
KVTIER_AVX2 __attribute__((always_inline)) inline __m256 LoadRow8(const float* p) { return _mm256_loadu_ps(p); }
KVTIER_AVX2 __attribute__((always_inline)) inline __m256 LoadRow8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Sums of one 4-head x 3-token tile, sums[h * 3 + k] = q[h] . token[k].
// Each head's load is pinned to a register: GCC otherwise folds it into
// each of its three FMAs, three loads where one does.
template <typename Row>
KVTIER_AVX2 __attribute__((noinline)) void ScoreTileAvx2(const Row* const tokens[kAvx2Tokens],
                                                         const float* const q[kGroup], uint32_t dim, float sums[16]) {
  KVTIER_AVX2_SCORE_SUMS(KVTIER_AVX2_ZERO)
  for (uint32_t c = 0; c < dim; c += 8) {
    const __m256 t0 = LoadRow8(tokens[0] + c), t1 = LoadRow8(tokens[1] + c), t2 = LoadRow8(tokens[2] + c);
#define KVTIER_AVX2_HEAD(h)                           \
  {                                                   \
    __m256 qh = _mm256_loadu_ps(q[h] + c);            \
    asm("" : "+x"(qh)); /* one load, in a register */ \
    a##h##0 = _mm256_fmadd_ps(qh, t0, a##h##0);       \
    a##h##1 = _mm256_fmadd_ps(qh, t1, a##h##1);       \
    a##h##2 = _mm256_fmadd_ps(qh, t2, a##h##2);       \
  }
    KVTIER_AVX2_HEAD(0) KVTIER_AVX2_HEAD(1) KVTIER_AVX2_HEAD(2) KVTIER_AVX2_HEAD(3)
#undef KVTIER_AVX2_HEAD
  }
  const __m256 zero = _mm256_setzero_ps();
  const __m256 first[8] = {a00, a01, a02, a10, a11, a12, a20, a21},
               second[8] = {a22, a30, a31, a32, zero, zero, zero, zero};
  _mm256_storeu_ps(sums, SumEach8(first));
  _mm256_storeu_ps(sums + 8, SumEach8(second));
}

// One 4-head x 16-channel tile over the block's tokens: out[h][c] +=
// sum_t p[h][t] * rows[t][c] for c < 16 (out[h] null for a padding head).
template <typename Row>
KVTIER_AVX2 __attribute__((noinline)) void WeightedTileAvx2(const Row* rows, uint32_t tokens, uint32_t dim,
                                                            const float* const p[kGroup], float* const out[kGroup]) {
  KVTIER_AVX2_CHANNEL_SUMS(KVTIER_AVX2_ZERO)
  for (uint32_t t = 0; t < tokens; ++t) {
    const __m256 r0 = LoadRow8(rows + size_t{t} * dim), r1 = LoadRow8(rows + size_t{t} * dim + 8);
#define KVTIER_AVX2_HEAD(h)                         \
  {                                                 \
    const __m256 w = _mm256_broadcast_ss(p[h] + t); \
    a##h##0 = _mm256_fmadd_ps(w, r0, a##h##0);      \
    a##h##1 = _mm256_fmadd_ps(w, r1, a##h##1);      \
  }
    KVTIER_AVX2_HEAD(0) KVTIER_AVX2_HEAD(1) KVTIER_AVX2_HEAD(2) KVTIER_AVX2_HEAD(3)
#undef KVTIER_AVX2_HEAD
  }
  const __m256 sums[8] = {KVTIER_AVX2_CHANNEL_SUMS(KVTIER_AVX2_LIST)};
  for (uint32_t h = 0; h < kGroup; ++h) {
    if (out[h] == nullptr) continue;
    for (uint32_t j = 0; j < 2; ++j) {
      _mm256_storeu_ps(out[h] + 8 * j, _mm256_add_ps(_mm256_loadu_ps(out[h] + 8 * j), sums[h * 2 + j]));
    }
  }
}

// Zeros standing in for the heads past the last and the tokens past the
// block's end, so that every tile is whole (all-zero bits: 0 as a float
// and as a bf16).
const float* Zeros(size_t n) {
  thread_local std::vector<float> zeros;
  return Sized(zeros, n);
}

// The heads h0..h0+3 of `q` [heads][dim] (zeros past the last).
void HeadGroup(const float* q, uint32_t heads, uint32_t dim, uint32_t h0, const float* zeros,
               const float* group[kGroup]) {
  for (uint32_t h = 0; h < kGroup; ++h) group[h] = h0 + h < heads ? q + size_t{h0 + h} * dim : zeros;
}

template <typename Row>
KVTIER_AVX512 void FloatBlockScoresAvx512(const Row* rows, uint32_t tokens, uint32_t dim, uint32_t heads,
                                          const float* q, float* scores, size_t stride) {
  const float* zeros = Zeros(dim);
  for (uint32_t t0 = 0; t0 < tokens; t0 += kGroup) {
    const uint32_t n = std::min(kGroup, tokens - t0);
    const Row* token[kGroup];
    for (uint32_t k = 0; k < kGroup; ++k)
      token[k] = k < n ? rows + size_t{t0 + k} * dim : reinterpret_cast<const Row*>(zeros);
    for (uint32_t h0 = 0; h0 < heads; h0 += kGroup) {
      const float* qh[kGroup];
      HeadGroup(q, heads, dim, h0, zeros, qh);
      StoreTileRows(ScoreTile(token, qh, dim), std::min(kGroup, heads - h0), n, scores + size_t{h0} * stride + t0,
                    stride);
    }
  }
}

template <typename Row>
KVTIER_AVX2 void FloatBlockScoresAvx2(const Row* rows, uint32_t tokens, uint32_t dim, uint32_t heads, const float* q,
                                      float* scores, size_t stride) {
  const float* zeros = Zeros(dim);
  for (uint32_t t0 = 0; t0 < tokens; t0 += kAvx2Tokens) {
    const uint32_t n = std::min(kAvx2Tokens, tokens - t0);
    const Row* token[kAvx2Tokens];
    for (uint32_t k = 0; k < kAvx2Tokens; ++k)
      token[k] = k < n ? rows + size_t{t0 + k} * dim : reinterpret_cast<const Row*>(zeros);
    for (uint32_t h0 = 0; h0 < heads; h0 += kGroup) {
      const float* qh[kGroup];
      HeadGroup(q, heads, dim, h0, zeros, qh);
      float lanes[16];
      ScoreTileAvx2(token, qh, dim, lanes);
      for (uint32_t h = 0; h < std::min(kGroup, heads - h0); ++h) {
        std::copy_n(lanes + h * kAvx2Tokens, n, scores + size_t{h0 + h} * stride + t0);
      }
    }
  }
}

// Heads h0..h0+3's weights and outputs at channel c0 (a padding head: zero
// weights, no output).
void WeightedGroup(const float* p, size_t stride, float* out, uint32_t kv, uint32_t heads, uint32_t h0, uint32_t c0,
                   const float* zeros, const float* ph[kGroup], float* oh[kGroup]) {
  for (uint32_t h = 0; h < kGroup; ++h) {
    const bool real = h0 + h < heads;
    ph[h] = real ? p + size_t{h0 + h} * stride : zeros;
    oh[h] = real ? out + size_t{h0 + h} * kv + c0 : nullptr;
  }
}

template <typename Row>
KVTIER_AVX512 void FloatBlockWeightedSumAvx512(const Row* rows, uint32_t tokens, uint32_t dim, uint32_t kv,
                                               uint32_t heads, const float* p, size_t stride, float* out) {
  const float* zeros = Zeros(tokens);
  for (uint32_t c0 = 0; c0 < kv; c0 += 16 * kGroup) {
    const uint32_t chunks = std::min(kGroup, (kv - c0) / 16);
    for (uint32_t h0 = 0; h0 < heads; h0 += kGroup) {
      const float* ph[kGroup];
      float* oh[kGroup];
      WeightedGroup(p, stride, out, kv, heads, h0, c0, zeros, ph, oh);
      WeightedTile(rows + c0, tokens, dim, ph, oh, chunks);
    }
  }
}

template <typename Row>
KVTIER_AVX2 void FloatBlockWeightedSumAvx2(const Row* rows, uint32_t tokens, uint32_t dim, uint32_t kv, uint32_t heads,
                                           const float* p, size_t stride, float* out) {
  const float* zeros = Zeros(tokens);
  for (uint32_t c0 = 0; c0 < kv; c0 += 16) {
    for (uint32_t h0 = 0; h0 < heads; h0 += kGroup) {
      const float* ph[kGroup];
      float* oh[kGroup];
      WeightedGroup(p, stride, out, kv, heads, h0, c0, zeros, ph, oh);
      WeightedTileAvx2(rows + c0, tokens, dim, ph, oh);
    }
  }
}

template <typename Row>
void BlockScores(const Row* rows, uint32_t tokens, uint32_t dim, uint32_t heads, const float* q, float* scores,
                 size_t stride) {
  if (HasAvx512()) return FloatBlockScoresAvx512(rows, tokens, dim, heads, q, scores, stride);
  FloatBlockScoresAvx2(rows, tokens, dim, heads, q, scores, stride);
}

template <typename Row>
void BlockWeightedSum(const Row* rows, uint32_t tokens, uint32_t dim, uint32_t kv, uint32_t heads, const float* p,
                      size_t stride, float* out) {
  if (HasAvx512()) return FloatBlockWeightedSumAvx512(rows, tokens, dim, kv, heads, p, stride, out);
  FloatBlockWeightedSumAvx2(rows, tokens, dim, kv, heads, p, stride, out);
}

}  // namespace

void FloatBlockScores(const float* rows, uint32_t tokens, uint32_t dim, uint32_t heads, const float* q, float* scores,
                      size_t stride) {
  BlockScores(rows, tokens, dim, heads, q, scores, stride);
}

void FloatBlockScores(const uint16_t* rows, uint32_t tokens, uint32_t dim, uint32_t heads, const float* q,
                      float* scores, size_t stride) {
  BlockScores(rows, tokens, dim, heads, q, scores, stride);
}

void FloatBlockWeightedSum(const float* rows, uint32_t tokens, uint32_t dim, uint32_t kv, uint32_t heads,
                           const float* p, size_t stride, float* out) {
  BlockWeightedSum(rows, tokens, dim, kv, heads, p, stride, out);
}

void FloatBlockWeightedSum(const uint16_t* rows, uint32_t tokens, uint32_t dim, uint32_t kv, uint32_t heads,
                           const float* p, size_t stride, float* out) {
  BlockWeightedSum(rows, tokens, dim, kv, heads, p, stride, out);
}

namespace {

KVTIER_AVX512 void WidenFp8Avx512(const uint8_t* payload, uint32_t tokens, uint32_t kv, uint32_t rope, float* rows) {
  // A token: kv E4M3 codes, a float scale per tile of kFp8TileSize, rope bf16.
  const uint32_t tiles = (kv + kFp8TileSize - 1) / kFp8TileSize, dim = kv + rope;
  const size_t token_bytes = EncodedBytes(Codec::kFp8, {1, kv, rope});
  const __m512i seven = _mm512_set1_epi32(0x7), magnitude_mask = _mm512_set1_epi32(0x7f);
  const __m512i bias = _mm512_set1_epi32(120 << 23), nan = _mm512_set1_epi32(0x7fc00000);
  for (uint32_t t = 0; t < tokens; ++t) {
    const uint8_t* src = payload + t * token_bytes;
    float* row = rows + size_t{t} * dim;
    for (uint32_t c = 0; c < kv; c += 16) {
      float scale;
      std::memcpy(&scale, src + kv + 4 * (c / kFp8TileSize), sizeof scale);
      const __m512i code = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c)));
      const __m512i magnitude = _mm512_and_si512(code, magnitude_mask);
      // As Fp8E4m3ToFloat: normal (m << 20) + 120 << 23, subnormal (c & 7) / 512, 0x7f NaN.
      __m512i bits = _mm512_add_epi32(_mm512_slli_epi32(magnitude, 20), bias);
      const __m512 subnormal =
          _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(code, seven)), _mm512_set1_ps(1.0f / 512));
      bits = _mm512_mask_mov_epi32(bits, _mm512_cmplt_epi32_mask(magnitude, _mm512_set1_epi32(0x08)),
                                   _mm512_castps_si512(subnormal));
      bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(magnitude, magnitude_mask), nan);
      bits = _mm512_or_si512(bits, _mm512_slli_epi32(_mm512_andnot_si512(magnitude_mask, code), 24));
      _mm512_storeu_ps(row + c, _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(scale)));
    }
    const uint8_t* rope_src = src + kv + 4 * size_t{tiles};
    const auto* rope_bf16 = reinterpret_cast<const uint16_t*>(rope_src);
    for (uint32_t c = 0; c < rope; c += 16) _mm512_storeu_ps(row + kv + c, LoadRow(rope_bf16 + c, 0xffff));
  }
}

KVTIER_AVX512 void WidenInt4Avx512(const uint8_t* payload, uint32_t tokens, uint32_t dim, float* rows) {
  // Each token's codes: byte k holds channel k (low nibble) and channel
  // dim / 2 + k (high), after the block's scales and zero points.
  const uint32_t half = dim / 2;
  const uint8_t* codes = payload + 4 * size_t{dim};
  const __m512i low = _mm512_set1_epi32(0xf);
  for (uint32_t t = 0; t < tokens; ++t) {
    const uint8_t* src = codes + size_t{t} * half;
    float* row = rows + size_t{t} * dim;
    for (uint32_t k = 0; k < half; k += 16) {
      const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k)));
      _mm512_storeu_ps(row + k, _mm512_cvtepi32_ps(_mm512_and_si512(bytes, low)));
      _mm512_storeu_ps(row + half + k, _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4)));
    }
  }
}

// 8 bytes at `p` as 32-bit lanes.
KVTIER_AVX2 __attribute__((always_inline)) inline __m256i Bytes8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// WidenFp8Avx512's steps, 8 codes at a time, with blends for its masks.
KVTIER_AVX2 void WidenFp8Avx2(const uint8_t* payload, uint32_t tokens, uint32_t kv, uint32_t rope, float* rows) {
  const uint32_t tiles = (kv + kFp8TileSize - 1) / kFp8TileSize, dim = kv + rope;
  const size_t token_bytes = EncodedBytes(Codec::kFp8, {1, kv, rope});
  const __m256i seven = _mm256_set1_epi32(0x7), eight = _mm256_set1_epi32(0x8);
  const __m256i magnitude_mask = _mm256_set1_epi32(0x7f);
  const __m256i bias = _mm256_set1_epi32(120 << 23), nan = _mm256_set1_epi32(0x7fc00000);
  for (uint32_t t = 0; t < tokens; ++t) {
    const uint8_t* src = payload + t * token_bytes;
    float* row = rows + size_t{t} * dim;
    for (uint32_t c = 0; c < kv; c += 8) {
      float scale;
      std::memcpy(&scale, src + kv + 4 * (c / kFp8TileSize), sizeof scale);
      const __m256i code = Bytes8(src + c);
      const __m256i magnitude = _mm256_and_si256(code, magnitude_mask);
      __m256i bits = _mm256_add_epi32(_mm256_slli_epi32(magnitude, 20), bias);
      const __m256 subnormal =
          _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(code, seven)), _mm256_set1_ps(1.0f / 512));
      bits = _mm256_blendv_epi8(bits, _mm256_castps_si256(subnormal), _mm256_cmpgt_epi32(eight, magnitude));
      bits = _mm256_blendv_epi8(bits, nan, _mm256_cmpeq_epi32(magnitude, magnitude_mask));
      bits = _mm256_or_si256(bits, _mm256_slli_epi32(_mm256_andnot_si256(magnitude_mask, code), 24));
      _mm256_storeu_ps(row + c, _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(scale)));
    }
    const uint8_t* rope_src = src + kv + 4 * size_t{tiles};
    const auto* rope_bf16 = reinterpret_cast<const uint16_t*>(rope_src);
    for (uint32_t c = 0; c < rope; c += 8) _mm256_storeu_ps(row + kv + c, LoadRow8(rope_bf16 + c));
  }
}

KVTIER_AVX2 void WidenInt4Avx2(const uint8_t* payload, uint32_t tokens, uint32_t dim, float* rows) {
  const uint32_t half = dim / 2;
  const uint8_t* codes = payload + 4 * size_t{dim};
  const __m256i low = _mm256_set1_epi32(0xf);
  for (uint32_t t = 0; t < tokens; ++t) {
    const uint8_t* src = codes + size_t{t} * half;
    float* row = rows + size_t{t} * dim;
    for (uint32_t k = 0; k < half; k += 8) {
      const __m256i bytes = Bytes8(src + k);
      _mm256_storeu_ps(row + k, _mm256_cvtepi32_ps(_mm256_and_si256(bytes, low)));
      _mm256_storeu_ps(row + half + k, _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4)));
    }
  }
}

}  // namespace

void WidenFp8Block(const uint8_t* payload, uint32_t tokens, uint32_t kv, uint32_t rope, float* rows) {
  if (HasAvx512()) return WidenFp8Avx512(payload, tokens, kv, rope, rows);
  WidenFp8Avx2(payload, tokens, kv, rope, rows);
}

void WidenInt4Codes(const uint8_t* payload, uint32_t tokens, uint32_t dim, float* rows) {
  if (HasAvx512()) return WidenInt4Avx512(payload, tokens, dim, rows);
  WidenInt4Avx2(payload, tokens, dim, rows);
}

#else  // not x86-64 with GCC or clang: the portable path only

bool FloatTilesUsable(uint32_t, uint32_t) { return false; }
void FloatBlockScores(const float*, uint32_t, uint32_t, uint32_t, const float*, float*, size_t) {}
void FloatBlockScores(const uint16_t*, uint32_t, uint32_t, uint32_t, const float*, float*, size_t) {}
void FloatBlockWeightedSum(const float*, uint32_t, uint32_t, uint32_t, uint32_t, const float*, size_t, float*) {}
void FloatBlockWeightedSum(const uint16_t*, uint32_t, uint32_t, uint32_t, uint32_t, const float*, size_t, float*) {}
void WidenFp8Block(const uint8_t*, uint32_t, uint32_t, uint32_t, float*) {}
void WidenInt4Codes(const uint8_t*, uint32_t, uint32_t, float*) {}

#endif

namespace {

// AddRowSums without tiles: for each head h < heads, dst[h * kv + c] +=
// sum over t < tokens of p[h * tokens + t] * rows[t * dim + c], summed in token
// order: 64 channels of a head at a time held in registers over all the
// tokens (`dst[c] += p * row[c]` token by token loaded and stored them on
// every step), every head in turn over the same 64 channels of the rows
// while they are in L1.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // the 32-byte vectors stay inside this function
KVTIER_VECTOR_CLONES void AddWeightedRows(const float* p, size_t tokens, uint32_t heads, const float* rows,
                                          uint32_t dim, uint32_t kv, float* dst) {
  constexpr uint32_t kLanes = 8, kVectors = 8;
  uint32_t c0 = 0;
  for (; c0 + kLanes * kVectors <= kv; c0 += kLanes * kVectors) {
    for (uint32_t h = 0; h < heads; ++h) {
      const float* ph = p + h * tokens;
      float* out = dst + size_t{h} * kv + c0;
      Lanes8 acc[kVectors];
      for (uint32_t j = 0; j < kVectors; ++j) acc[j] = Load8(out + j * kLanes);
      for (size_t t = 0; t < tokens; ++t) {
        const float pt = ph[t];
        const float* row = rows + t * dim + c0;
        for (uint32_t j = 0; j < kVectors; ++j) acc[j] += pt * Load8(row + j * kLanes);
      }
      for (uint32_t j = 0; j < kVectors; ++j) std::memcpy(out + j * kLanes, &acc[j], sizeof acc[j]);
    }
  }
  for (uint32_t h = 0; h < heads; ++h) {
    for (size_t t = 0; t < tokens; ++t) {
      for (size_t c = c0; c < kv; ++c) dst[size_t{h} * kv + c] += p[h * tokens + t] * rows[t * dim + c];
    }
  }
}
#pragma GCC diagnostic pop

}  // namespace

void RowScores(const float* rows, size_t tokens, uint32_t dim, uint32_t heads, const float* q, float* p) {
  if (AttentionTilesEnabled() && FloatTilesUsable(dim, dim) && tokens <= UINT32_MAX) {
    return FloatBlockScores(rows, static_cast<uint32_t>(tokens), dim, heads, q, p, tokens);
  }
  Gemm(rows, tokens, dim, q, heads, dim, p, tokens);
}

void AddRowSums(const float* p, size_t tokens, uint32_t heads, const float* rows, uint32_t dim, uint32_t kv,
                float* dst) {
  if (AttentionTilesEnabled() && FloatTilesUsable(dim, kv) && tokens <= UINT32_MAX) {
    return FloatBlockWeightedSum(rows, static_cast<uint32_t>(tokens), dim, kv, heads, p, tokens, dst);
  }
  AddWeightedRows(p, tokens, heads, rows, dim, kv, dst);
}

}  // namespace kvtier::kernels::cpu
