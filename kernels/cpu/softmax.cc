// Attention's softmax: one exp per score, so at a 2,048-token prefill 33 M
// a layer; libm's expf one at a time was a visible share of both attention
// forms (perf), so AVX-512 CPUs take sixteen at a time.
#include <algorithm>
#include <cmath>

#include "avx512.h"
#include "kvtier/kernels/layers.h"

namespace kvtier::kernels {
namespace {

void SoftmaxScalar(float* x, size_t n, float scale) {
  const float max = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) sum += (x[i] = std::exp((x[i] - max) * scale));
  const float inv = 1.0f / sum;
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
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

KVTIER_AVX512 void SoftmaxAvx512(float* x, size_t n, float scale) {
  __m512 max = _mm512_set1_ps(-INFINITY);
  for (size_t i = 0; i < n; i += 16) max = _mm512_max_ps(max, _mm512_mask_loadu_ps(max, cpu::TailMask(n, i), x + i));
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(max)), factor = _mm512_set1_ps(scale);
  __m512 sum = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = cpu::TailMask(n, i);
    const __m512 e = ExpNonPositive(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), top), factor));
    _mm512_mask_storeu_ps(x + i, m, e);
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = cpu::TailMask(n, i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
  }
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
  const float rescale = new_max == max ? 1.0f : std::exp(max - new_max);
  sum = sum * rescale + _mm512_reduce_add_ps(chunk);
  max = new_max;
  return rescale;
}

#endif

}  // namespace

float SoftmaxChunk(float* x, size_t n, float scale, float& max, float& sum) {
#ifdef KVTIER_AVX512
  if (cpu::HasAvx512()) return SoftmaxChunkAvx512(x, n, scale, max, sum);
#endif
  float new_max = max;
  for (size_t i = 0; i < n; ++i) new_max = std::max(new_max, x[i] * scale);
  float chunk = 0.0f;
  for (size_t i = 0; i < n; ++i) chunk += (x[i] = std::exp(std::fma(x[i], scale, -new_max)));
  const float rescale = new_max == max ? 1.0f : std::exp(max - new_max);
  sum = sum * rescale + chunk;
  max = new_max;
  return rescale;
}

void Softmax(float* x, size_t n, float scale) {
#ifdef KVTIER_AVX512
  if (cpu::HasAvx512()) return SoftmaxAvx512(x, n, scale);
#endif
  SoftmaxScalar(x, n, scale);
}

}  // namespace kvtier::kernels
