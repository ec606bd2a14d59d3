#include "kvtier/kernels/mla_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "codec_internal.h"
#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/parallel.h"
#include "mla_attention_float.h"
#include "mla_attention_int8.h"
#include "scratch.h"

namespace kvtier::kernels {
namespace {

std::atomic<bool> tiles_enabled{true};

// Widens token t of a bf16 or fp8 block to floats (latent then rope).
KVTIER_VECTOR_CLONES void WidenRow(const LatentBlock& b, const MlaShape& s, uint32_t t, float* row) {
  const uint32_t dim = s.kv_lora_rank + s.rope_dim;
  if (b.codec == Codec::kBf16) {
    const uint8_t* src = b.payload.data() + size_t{t} * dim * 2;
    for (size_t c = 0; c < dim; ++c) row[c] = Bf16ToFloat(cpu::LoadU16(src + 2 * c));
    return;
  }
  const uint32_t tiles = (s.kv_lora_rank + kFp8TileSize - 1) / kFp8TileSize;
  const size_t token_bytes = EncodedBytes(Codec::kFp8, {1, s.kv_lora_rank, s.rope_dim});
  const uint8_t* src = b.payload.data() + t * token_bytes;
  for (uint32_t tile = 0; tile < tiles; ++tile) {
    float scale;
    std::memcpy(&scale, src + s.kv_lora_rank + 4 * tile, 4);
    const uint32_t end = std::min((tile + 1) * kFp8TileSize, s.kv_lora_rank);
    for (uint32_t c = tile * kFp8TileSize; c < end; ++c) row[c] = Fp8E4m3ToFloat(src[c]) * scale;
  }
  const uint8_t* rope = src + s.kv_lora_rank + 4 * size_t{tiles};
  for (size_t c = 0; c < s.rope_dim; ++c) row[s.kv_lora_rank + c] = Bf16ToFloat(cpu::LoadU16(rope + 2 * c));
}

// Per-channel scale (and zero point, int4) of an int8/int4 block.
void ChannelParams(const LatentBlock& b, uint32_t dim, float* scale, float* zero) {
  for (uint32_t c = 0; c < dim; ++c) {
    scale[c] = Bf16ToFloat(cpu::LoadU16(b.payload.data() + 2 * c));
    zero[c] = b.codec == Codec::kInt4 ? Bf16ToFloat(cpu::LoadU16(b.payload.data() + 2 * (size_t{dim} + c))) : 0.0f;
  }
}

// Token t's integer codes of an int8/int4 block, as floats.
KVTIER_VECTOR_CLONES void CodeRow(const LatentBlock& b, uint32_t dim, uint32_t t, float* codes) {
  if (b.codec == Codec::kInt8) {
    const auto* src = reinterpret_cast<const int8_t*>(b.payload.data() + 2 * size_t{dim}) + size_t{t} * dim;
    for (size_t c = 0; c < dim; ++c) codes[c] = src[c];
    return;
  }
  const uint32_t half = (dim + 1) / 2;
  const uint8_t* src = b.payload.data() + 4 * size_t{dim} + size_t{t} * half;
  for (size_t k = 0; k < half; ++k) codes[k] = static_cast<float>(src[k] & 0xf);
  for (size_t k = 0; k < dim - half; ++k) codes[half + k] = static_cast<float>(src[k] >> 4);
}

// Token t of a block as floats: its values (bf16, fp8), or its integer
// codes (int8, int4), the scales and zero points left to the caller.
void TokenRow(const LatentBlock& b, const MlaShape& s, uint32_t t, float* row) {
  if (b.codec == Codec::kInt8 || b.codec == Codec::kInt4) {
    CodeRow(b, s.kv_lora_rank + s.rope_dim, t, row);
  } else {
    WidenRow(b, s, t, row);
  }
}

// AttendHeads' buffers, kept per thread between calls (it runs for every
// layer of every sequence), so that none is allocated, zeroed and faulted
// in each time.
struct AttendScratch {
  std::vector<float> q, scores, scale, zero, qs, bias, rows, acc, max, sum;
};

AttendScratch& ThreadAttendScratch() {
  thread_local AttendScratch scratch;
  return scratch;
}

// Float tail rows attended at a time: their scores, then their weighted
// sums while the rows are still in cache.
constexpr size_t kTailChunk = 128;

// AbsorbedMlaDecode for s.heads heads, its arguments checked. Each block
// (and each chunk of the tail) is read once: its scores, a step of an
// online softmax (the sums so far rescaled when a head's largest score
// grows), then its weighted sums; the sums are divided by the softmax's
// denominators at the end.
KVTIER_VECTOR_CLONES void AttendHeads(const MlaShape& s, std::span<const float> q_latent, std::span<const float> q_rope,
                                      float softmax_scale, std::span<const LatentBlock> blocks,
                                      std::span<const float> tail, std::span<float> out) {
  const uint32_t kv = s.kv_lora_rank, rope = s.rope_dim, dim = kv + rope, heads = s.heads;
  // Every buffer is written before its values are used.
  AttendScratch& scratch = ThreadAttendScratch();

  // Queries as one [heads][dim] array: latent part then rope part.
  float* q = cpu::Sized(scratch.q, size_t{heads} * dim);
  for (uint32_t h = 0; h < heads; ++h) {
    std::copy_n(q_latent.data() + size_t{h} * kv, kv, q + size_t{h} * dim);
    std::copy_n(q_rope.data() + size_t{h} * rope, rope, q + size_t{h} * dim + kv);
  }
  float* scale = cpu::Sized(scratch.scale, dim);
  float* zero = cpu::Sized(scratch.zero, dim);
  float* qs = cpu::Sized(scratch.qs, size_t{heads} * dim);
  float* bias = cpu::Sized(scratch.bias, heads);
  float* acc = cpu::Sized(scratch.acc, size_t{heads} * kv);
  float* max = cpu::Sized(scratch.max, heads);
  float* sum = cpu::Sized(scratch.sum, heads);
  std::fill_n(max, heads, -INFINITY);
  std::fill_n(sum, heads, 0.0f);
  std::fill(out.begin(), out.end(), 0.0f);

  // A chunk's scores, [heads][tokens], become its softmax weights; the
  // sums of earlier chunks are rescaled to the new largest scores.
  auto weights = [&](float* p, size_t tokens) {
    for (uint32_t h = 0; h < heads; ++h) {
      const float factor = SoftmaxChunk(p + h * tokens, tokens, softmax_scale, max[h], sum[h]);
      if (factor != 1.0f) {
        for (float& v : out.subspan(size_t{h} * kv, kv)) v *= factor;
      }
    }
  };

  // int8 blocks take integer dot products where the CPU has them (AVX-512
  // VNNI or AVX2); where it has AVX2 or AVX-512, bf16 blocks take the float
  // register tiles as they lie; the others are widened to floats (codes,
  // for int8 and int4) for RowScores and AddRowSums (the tiles, else Gemm
  // and plain loops).
  const bool integer_int8 = cpu::AttentionTilesEnabled() && cpu::Int8IntegerUsable(dim, kv);
  const bool tiles = cpu::AttentionTilesEnabled() && cpu::FloatTilesUsable(dim, kv);
  for (const LatentBlock& b : blocks) {
    const uint32_t n = b.tokens;
    float* p = cpu::Sized(scratch.scores, size_t{heads} * n);
    if (integer_int8 && b.codec == Codec::kInt8) {
      cpu::Int8BlockScores(b.payload.data(), n, dim, heads, q, p, n);
      weights(p, n);
      cpu::Int8BlockWeightedSum(b.payload.data(), n, dim, kv, heads, p, n, out.data());
      continue;
    }
    if (tiles && b.codec == Codec::kBf16) {  // the tiles widen its values in registers
      const auto* rows = reinterpret_cast<const uint16_t*>(b.payload.data());
      cpu::FloatBlockScores(rows, n, dim, heads, q, p, n);
      weights(p, n);
      cpu::FloatBlockWeightedSum(rows, n, dim, kv, heads, p, n, out.data());
      continue;
    }
    const bool integer = b.codec == Codec::kInt8 || b.codec == Codec::kInt4;
    if (integer) {  // fold scales into the query: q.(z + s*code) = q.z + (q*s).code
      ChannelParams(b, dim, scale, zero);
      for (uint32_t h = 0; h < heads; ++h) {
        const float* qh = q + size_t{h} * dim;
        for (uint32_t c = 0; c < dim; ++c) qs[size_t{h} * dim + c] = qh[c] * scale[c];
        Gemv(qh, 1, dim, zero, &bias[h]);
      }
    }
    const float* query = integer ? qs : q;
    float* rows = cpu::Sized(scratch.rows, size_t{n} * dim);
    if (tiles && b.codec == Codec::kInt4 && dim % 32 == 0) {
      cpu::WidenInt4Codes(b.payload.data(), n, dim, rows);
    } else if (tiles && b.codec == Codec::kFp8 && rope % 16 == 0) {
      cpu::WidenFp8Block(b.payload.data(), n, kv, rope, rows);
    } else {  // the widenings above are AVX2 or AVX-512 code
      for (uint32_t t = 0; t < n; ++t) TokenRow(b, s, t, rows + size_t{t} * dim);
    }
    cpu::RowScores(rows, n, dim, heads, query, p);
    if (integer) {
      for (uint32_t h = 0; h < heads; ++h) {
        for (uint32_t t = 0; t < n; ++t) p[size_t{h} * n + t] += bias[h];
      }
    }
    weights(p, n);
    float* dst = integer ? acc : out.data();  // integer: sums of p * code
    if (integer) std::fill_n(acc, size_t{heads} * kv, 0.0f);
    cpu::AddRowSums(p, n, heads, rows, dim, kv, dst);
    if (integer) {  // sum_t p*(z + s*code) = z*sum_t p + s*sum_t p*code
      for (uint32_t h = 0; h < heads; ++h) {
        float psum = 0.0f;
        for (uint32_t t = 0; t < n; ++t) psum += p[size_t{h} * n + t];
        for (uint32_t c = 0; c < kv; ++c) {
          out[size_t{h} * kv + c] += zero[c] * psum + scale[c] * acc[size_t{h} * kv + c];
        }
      }
    }
  }
  for (size_t t0 = 0; t0 < tail.size() / dim; t0 += kTailChunk) {
    const auto n = static_cast<uint32_t>(std::min(kTailChunk, tail.size() / dim - t0));
    const float* rows = tail.data() + t0 * dim;
    float* p = cpu::Sized(scratch.scores, size_t{heads} * n);
    cpu::RowScores(rows, n, dim, heads, q, p);
    weights(p, n);
    cpu::AddRowSums(p, n, heads, rows, dim, kv, out.data());
  }
  for (uint32_t h = 0; h < heads; ++h) {
    const float inverse = 1.0f / sum[h];
    for (float& v : out.subspan(size_t{h} * kv, kv)) v *= inverse;
  }
}

}  // namespace

void SetAttentionTilesForTesting(bool enabled) { tiles_enabled = enabled; }

bool cpu::AttentionTilesEnabled() { return tiles_enabled; }

Status AbsorbedMlaDecode(const MlaShape& s, std::span<const float> q_latent, std::span<const float> q_rope,
                         float softmax_scale, std::span<const LatentBlock> blocks, std::span<const float> tail,
                         std::span<float> out) {
  const uint32_t kv = s.kv_lora_rank, rope = s.rope_dim, dim = kv + rope, heads = s.heads;
  if (heads == 0 || kv == 0 || q_latent.size() != size_t{heads} * kv || q_rope.size() != size_t{heads} * rope ||
      out.size() != size_t{heads} * kv || tail.size() % dim != 0) {
    return InvalidArgument("AbsorbedMlaDecode: q, out or tail sizes disagree with the shape");
  }
  bool any_token = !tail.empty();
  for (const LatentBlock& b : blocks) {
    if (EncodedBytes(b.codec, {b.tokens, kv, rope}) != b.payload.size() || b.payload.empty()) {
      return InvalidArgument("AbsorbedMlaDecode: a block's payload does not match its codec and tokens");
    }
    any_token = any_token || b.tokens > 0;
  }
  if (!any_token) return InvalidArgument("AbsorbedMlaDecode: no context tokens");
  // Heads attend independently: the kernel threads take them in groups of
  // at least 4 (the int8 tiles' width). Inside a batch the model already
  // spreads its sequences over the threads, and this runs inline.
  ParallelFor(heads, 4, [&](size_t begin, size_t end) {
    const MlaShape part{static_cast<uint32_t>(end - begin), kv, rope};
    AttendHeads(part, q_latent.subspan(begin * kv, (end - begin) * kv),
                q_rope.subspan(begin * rope, (end - begin) * rope), softmax_scale, blocks, tail,
                out.subspan(begin * kv, (end - begin) * kv));
  });
  return OkStatus();
}

}  // namespace kvtier::kernels
