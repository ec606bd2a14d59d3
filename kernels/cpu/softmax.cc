// Attention's softmax: one exp per score, so at a 2,048-token prefill 33 M
// a layer; libm's expf one at a time was a visible share of both attention
// forms (perf), so AVX-512 CPUs take sixteen at a time and AVX2 CPUs eight.
#include <algorithm>
#include <cmath>

#include "avx512.h"
#include "kvtier/kernels/layers.h"

namespace kvtier::kernels {
namespace {

// SoftmaxChunk's last step: `max` and `sum` move to the chunk's new
// largest scaled score, the chunk's exponentials' sum added; returns the
// factor for what earlier chunks weighted.
float MoveTo(float new_max, float chunk_sum, float& max, float& sum) {
  const float rescale = new_max == max ? 1.0f : std::exp(max - new_max);
  sum = sum * rescale + chunk_sum;
  max = new_max;
  return rescale;
}

#ifdef KVTIER_AVX512

// exp(x) for x <= 0: x = k ln2 + r with |r| <= ln2 / 2 (ln2 in two parts,
// so r is exact to float precision), e^r by its Taylor series to r^7
// (remainder under 2^-27 of the result), times 2^k by vscalefps, which
// also gives 0 below the float range.
KVTIER_AVX512 inline __m512 ExpNonPositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));  // e^-104 is 0 in float
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145752f), x);  // ln2's top 16 bits
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860677e-6f), r);       // and the rest
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  for (const float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) {
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  }
  return _mm512_scalef_ps(p, k);
}

KVTIER_AVX512 float SoftmaxChunkAvx512(float* x, size_t n, float scale, float& max, float& sum) {
  const __m512 factor = _mm512_set1_ps(scale), none = _mm512_set1_ps(-INFINITY);
  __m512 top = _mm512_set1_ps(max);
  for (size_t i = 0; i < n; i += 16) {  // lanes past n are -infinity, which scaling keeps
    top = _mm512_max_ps(top, _mm512_mul_ps(_mm512_mask_loadu_ps(none, cpu::TailMask(n, i), x + i), factor));
  }
  const float new_max = _mm512_reduce_max_ps(top);
  const __m512 shift = _mm512_set1_ps(new_max);
  __m512 chunk = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = cpu::TailMask(n, i);
    const __m512 e = ExpNonPositive(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(m, x + i), factor, shift));
    _mm512_mask_storeu_ps(x + i, m, e);
    chunk = _mm512_mask_add_ps(chunk, m, chunk, e);
  }
  return MoveTo(new_max, _mm512_reduce_add_ps(chunk), max, sum);
}

// ExpNonPositive in 8 lanes. Without vscalefps, 2^k is two products,
// 2^(k + 64) (a normal float for every k >= -150) then 2^-64, so that
// results below the normal range round once, as vscalefps rounds them.
KVTIER_AVX2 inline __m256 ExpNonPositive8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
  const __m256 k =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145752f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  for (const float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) {
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  }
  const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127 + 64));
  return _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23))), _mm256_set1_ps(0x1p-64f));
}

// Lanes i..i+7 of n that exist, as a maskload's mask.
KVTIER_AVX2 inline __m256i TailMask8(size_t n, size_t i) {
  const auto live = static_cast<int>(std::min<size_t>(n - i, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(live), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

KVTIER_AVX2 inline float LaneMax(__m256 v) {
  const __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(pairs, _mm_movehdup_ps(pairs)));
}

KVTIER_AVX2 inline float LaneSum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

// The largest of x[0..n) times `scale` and `floor`.
KVTIER_AVX2 inline float ScaledMax(const float* x, size_t n, float scale, float floor) {
  const __m256 factor = _mm256_set1_ps(scale), none = _mm256_set1_ps(-INFINITY);
  __m256 top = _mm256_set1_ps(floor);
  for (size_t i = 0; i < n; i += 8) {  // lanes past n are -infinity, which scaling keeps
    const __m256i m = TailMask8(n, i);
    const __m256 v = _mm256_blendv_ps(none, _mm256_maskload_ps(x + i, m), _mm256_castsi256_ps(m));
    top = _mm256_max_ps(top, _mm256_mul_ps(v, factor));
  }
  return LaneMax(top);
}

// x[i] = exp(scale * x[i] - shift) in place; returns their sum.
KVTIER_AVX2 inline float ExpInPlace(float* x, size_t n, float scale, float shift) {
  const __m256 factor = _mm256_set1_ps(scale), offset = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 8) {
    const __m256i m = TailMask8(n, i);
    const __m256 e = _mm256_and_ps(ExpNonPositive8(_mm256_fmsub_ps(_mm256_maskload_ps(x + i, m), factor, offset)),
                                   _mm256_castsi256_ps(m));
    _mm256_maskstore_ps(x + i, m, e);
    sum = _mm256_add_ps(sum, e);
  }
  return LaneSum(sum);
}

KVTIER_AVX2 float SoftmaxChunkAvx2(float* x, size_t n, float scale, float& max, float& sum) {
  const float new_max = ScaledMax(x, n, scale, max);
  return MoveTo(new_max, ExpInPlace(x, n, scale, new_max), max, sum);
}
#endif

}  // namespace

float SoftmaxChunk(float* x, size_t n, float scale, float& max, float& sum) {
#ifdef KVTIER_AVX512
  if (cpu::HasAvx512()) return SoftmaxChunkAvx512(x, n, scale, max, sum);
  if (cpu::HasAvx2()) return SoftmaxChunkAvx2(x, n, scale, max, sum);
#endif
  float new_max = max;
  for (size_t i = 0; i < n; ++i) new_max = std::max(new_max, x[i] * scale);
  float chunk = 0.0f;
  for (size_t i = 0; i < n; ++i) chunk += (x[i] = std::exp(std::fma(x[i], scale, -new_max)));
  return MoveTo(new_max, chunk, max, sum);
}

void Softmax(float* x, size_t n, float scale) {  // one chunk, then divided by its sum
  float max = -INFINITY, sum = 0.0f;
  SoftmaxChunk(x, n, scale, max, sum);
  const float inverse = 1.0f / sum;
  for (size_t i = 0; i < n; ++i) x[i] *= inverse;
}

}  // namespace kvtier::kernels
