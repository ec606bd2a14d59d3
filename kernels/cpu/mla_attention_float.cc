#include "mla_attention_float.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "avx512.h"
#include "kvtier/kernels/codec.h"
#include "scratch.h"

namespace kvtier::kernels::cpu {

#if defined(__x86_64__) && defined(__GNUC__)

bool FloatTilesUsable(uint32_t dim, uint32_t kv_lora_rank) {
  return HasAvx512() && dim % 16 == 0 && kv_lora_rank % 16 == 0;
}

namespace {

constexpr uint32_t kGroup = 4;

#define KVTIER_TILE_ZERO(h, k) __m512 a##h##k = _mm512_setzero_ps();
#define KVTIER_TILE_FMA(h, k) a##h##k = _mm512_fmadd_ps(row, c##k, a##h##k);

// Sums of one 4-head x 4-token tile, lane h * 4 + k: q[h] . token[k].
KVTIER_AVX512 __attribute__((noinline)) __m512 ScoreTile(const float* const tokens[kGroup],
                                                         const float* const q[kGroup], uint32_t dim) {
  KVTIER_TILE(KVTIER_TILE_ZERO)
  for (uint32_t c = 0; c < dim; c += 16) {
#define KVTIER_TOKEN(k) _mm512_loadu_ps(tokens[k] + c)
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
KVTIER_AVX512 __attribute__((noinline)) void WeightedTile(const float* rows, uint32_t tokens, uint32_t dim,
                                                          const float* const p[kGroup], float* const out[kGroup],
                                                          uint32_t chunks) {
  __mmask16 live[kGroup];
  for (uint32_t j = 0; j < kGroup; ++j) live[j] = j < chunks ? 0xffff : 0;
  KVTIER_TILE(KVTIER_TILE_ZERO)
  for (uint32_t t = 0; t < tokens; ++t) {
#define KVTIER_CHANNELS(j) _mm512_maskz_loadu_ps(live[j], rows + size_t{t} * dim + 16 * j)
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

// Zeros standing in for the heads past the last and the tokens past the
// block's end, so that every tile is whole.
const float* Zeros(size_t n) {
  thread_local std::vector<float> zeros;
  return Sized(zeros, n);
}

}  // namespace

KVTIER_AVX512 void FloatBlockScores(const float* rows, uint32_t tokens, uint32_t dim, uint32_t heads, const float* q,
                                    float* scores, size_t stride) {
  const float* zeros = Zeros(dim);
  for (uint32_t t0 = 0; t0 < tokens; t0 += kGroup) {
    const uint32_t n = std::min(kGroup, tokens - t0);
    const float* token[kGroup];
    for (uint32_t k = 0; k < kGroup; ++k) token[k] = k < n ? rows + size_t{t0 + k} * dim : zeros;
    for (uint32_t h0 = 0; h0 < heads; h0 += kGroup) {
      const float* qh[kGroup];
      for (uint32_t h = 0; h < kGroup; ++h) qh[h] = h0 + h < heads ? q + size_t{h0 + h} * dim : zeros;
      StoreTileRows(ScoreTile(token, qh, dim), std::min(kGroup, heads - h0), n, scores + size_t{h0} * stride + t0,
                    stride);
    }
  }
}

KVTIER_AVX512 void FloatBlockWeightedSum(const float* rows, uint32_t tokens, uint32_t dim, uint32_t kv, uint32_t heads,
                                         const float* p, size_t stride, float* out) {
  const float* zeros = Zeros(tokens);
  for (uint32_t c0 = 0; c0 < kv; c0 += 16 * kGroup) {
    const uint32_t chunks = std::min(kGroup, (kv - c0) / 16);
    for (uint32_t h0 = 0; h0 < heads; h0 += kGroup) {
      const float* ph[kGroup];
      float* oh[kGroup];
      for (uint32_t h = 0; h < kGroup; ++h) {
        const bool real = h0 + h < heads;
        ph[h] = real ? p + size_t{h0 + h} * stride : zeros;
        oh[h] = real ? out + size_t{h0 + h} * kv + c0 : nullptr;
      }
      WeightedTile(rows + c0, tokens, dim, ph, oh, chunks);
    }
  }
}

KVTIER_AVX512 void WidenBf16Block(const uint8_t* payload, uint32_t tokens, uint32_t dim, float* rows) {
  for (size_t i = 0; i < size_t{tokens} * dim; i += 16) _mm512_storeu_ps(rows + i, Bf16ToFloats(payload + 2 * i));
}

KVTIER_AVX512 void WidenFp8Block(const uint8_t* payload, uint32_t tokens, uint32_t kv, uint32_t rope, float* rows) {
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
    for (uint32_t c = 0; c < rope; c += 16) _mm512_storeu_ps(row + kv + c, Bf16ToFloats(rope_src + 2 * c));
  }
}

KVTIER_AVX512 void WidenInt4Codes(const uint8_t* payload, uint32_t tokens, uint32_t dim, float* rows) {
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

#else  // no AVX-512 in this compiler's target: the portable path only

bool FloatTilesUsable(uint32_t, uint32_t) { return false; }
void FloatBlockScores(const float*, uint32_t, uint32_t, uint32_t, const float*, float*, size_t) {}
void FloatBlockWeightedSum(const float*, uint32_t, uint32_t, uint32_t, uint32_t, const float*, size_t, float*) {}
void WidenBf16Block(const uint8_t*, uint32_t, uint32_t, float*) {}
void WidenFp8Block(const uint8_t*, uint32_t, uint32_t, uint32_t, float*) {}
void WidenInt4Codes(const uint8_t*, uint32_t, uint32_t, float*) {}

#endif

}  // namespace kvtier::kernels::cpu
