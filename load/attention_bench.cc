// Absorbed MLA decode attention, one layer-step at DeepSeek-V2-Lite dims (16
// heads, 512 + 64), against this machine's memory read bandwidth measured in
// the same run over the same bytes: the roofline of a memory-bound kernel.
// Beside it the runtime's products and DeepSeek-V4's attention and indexer.
//
//   attention_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kvtier/kernels/expanded_attention.h"
#include "kvtier/kernels/indexer.h"
#include "kvtier/kernels/layers.h"
#include "kvtier/kernels/mla_attention.h"
#include "kvtier/kernels/parallel.h"
#include "kvtier/kernels/sink_attention.h"

namespace {

using kvtier::kernels::Codec;
using kvtier::kernels::LatentBlock;

constexpr kvtier::kernels::MlaShape kShape{16, 512, 64};
constexpr uint32_t kBlock = 64;

struct Context {
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<LatentBlock> blocks;
  size_t bytes = 0;
};

const Context& GetContext(Codec codec, uint32_t tokens) {
  static std::map<std::pair<int, uint32_t>, Context> cache;
  Context& ctx = cache[{static_cast<int>(codec), tokens}];
  if (!ctx.blocks.empty()) return ctx;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const kvtier::kernels::BlockShape shape{kBlock, kShape.kv_lora_rank, kShape.rope_dim};
  std::vector<float> x(shape.values());
  ctx.payloads.reserve(tokens / kBlock);
  for (uint32_t b = 0; b < tokens / kBlock; ++b) {
    for (float& v : x) v = normal(rng);
    std::vector<uint8_t> payload(kvtier::kernels::EncodedBytes(codec, shape));
    (void)kvtier::kernels::Quantize(codec, shape, x, payload);
    ctx.bytes += payload.size();
    ctx.payloads.push_back(std::move(payload));
    ctx.blocks.push_back({codec, kBlock, ctx.payloads.back()});
  }
  return ctx;
}

// One layer-step on `threads` kernel threads: AbsorbedMlaDecode gives each
// a share of the heads (the blocks are shared, read by all of them).
void Absorbed(benchmark::State& state, size_t threads) {
  const Codec codec = static_cast<Codec>(state.range(0));
  const auto tokens = static_cast<uint32_t>(state.range(1));
  const Context& ctx = GetContext(codec, tokens);
  std::vector<float> q(kShape.heads * kShape.kv_lora_rank, 0.01f), qr(kShape.heads * kShape.rope_dim, 0.01f),
      out(kShape.heads * kShape.kv_lora_rank);
  kvtier::kernels::SetKernelThreads(threads);
  for (auto _ : state) {
    (void)kvtier::kernels::AbsorbedMlaDecode(kShape, q, qr, 0.07f, ctx.blocks, {}, out);
    benchmark::DoNotOptimize(out.data());
  }
  kvtier::kernels::SetKernelThreads(1);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * ctx.bytes));
  state.SetLabel(std::string(kvtier::kernels::CodecName(codec)) +
                 (threads == 1 ? "" : " " + std::to_string(threads) + " threads"));
}

void BM_Absorbed(benchmark::State& state) { Absorbed(state, 1); }
void BM_AbsorbedTwoThreads(benchmark::State& state) { Absorbed(state, 2); }

// The forms seed 003 compares, for the same layer-step (float32 here):
// naive caches expanded per-head K (nope + rope) and V; latent caches the
// latents and re-expands every one of them through kv_b_proj at each step.
constexpr uint32_t kNope = 128, kV = 128;

struct Expanded {
  std::vector<float> k, v;  // [tokens][heads][nope + rope], [tokens][heads][v]
};

const Expanded& GetExpanded(uint32_t tokens) {
  static std::map<uint32_t, Expanded> cache;
  Expanded& e = cache[tokens];
  if (!e.k.empty()) return e;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  e.k.resize(size_t{tokens} * kShape.heads * (kNope + kShape.rope_dim));
  e.v.resize(size_t{tokens} * kShape.heads * kV);
  for (float& x : e.k) x = normal(rng);
  for (float& x : e.v) x = normal(rng);
  return e;
}

// softmax(q.k) then sum p.v per head, over an expanded cache.
void ExpandedAttention(const float* q, const float* k, const float* v, uint32_t tokens, float* out) {
  const uint32_t heads = kShape.heads, qk = kNope + kShape.rope_dim;
  std::vector<float> scores(tokens);
  for (uint32_t h = 0; h < heads; ++h) {
    float max = -INFINITY;
    for (uint32_t t = 0; t < tokens; ++t) {
      float s;
      kvtier::kernels::Gemv(k + (size_t{t} * heads + h) * qk, 1, qk, q + h * qk, &s);
      max = std::max(max, scores[t] = s * 0.07f);
    }
    float sum = 0;
    for (float& s : scores) sum += (s = std::exp(s - max));
    float* o = out + h * kV;
    std::fill(o, o + kV, 0.0f);
    for (uint32_t t = 0; t < tokens; ++t) {
      const float* vt = v + (size_t{t} * heads + h) * kV;
      for (uint32_t c = 0; c < kV; ++c) o[c] += scores[t] / sum * vt[c];
    }
  }
}

void BM_Naive(benchmark::State& state) {
  const auto tokens = static_cast<uint32_t>(state.range(0));
  const Expanded& e = GetExpanded(tokens);
  std::vector<float> q(kShape.heads * (kNope + kShape.rope_dim), 0.01f), out(kShape.heads * kV);
  for (auto _ : state) {
    ExpandedAttention(q.data(), e.k.data(), e.v.data(), tokens, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * (e.k.size() + e.v.size()) * 4));
  state.SetLabel("naive: expanded K/V cache");
}

void BM_LatentReexpanded(benchmark::State& state) {
  const auto tokens = static_cast<uint32_t>(state.range(0));
  const uint32_t heads = kShape.heads, kv = kShape.kv_lora_rank, rope = kShape.rope_dim;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> latents(size_t{tokens} * (kv + rope)), kv_b(size_t{heads} * (kNope + kV) * kv);
  for (float& x : latents) x = normal(rng);
  for (float& x : kv_b) x = normal(rng);
  Expanded e;
  e.k.resize(size_t{tokens} * heads * (kNope + rope));
  e.v.resize(size_t{tokens} * heads * kV);
  std::vector<float> q(heads * (kNope + rope), 0.01f), out(heads * kV), row(kNope + kV);
  for (auto _ : state) {
    // kv_b_proj(compressed_kv) for every cached token, every step.
    for (uint32_t t = 0; t < tokens; ++t) {
      const float* c = latents.data() + size_t{t} * (kv + rope);
      for (uint32_t h = 0; h < heads; ++h) {
        kvtier::kernels::Gemv(kv_b.data() + size_t{h} * (kNope + kV) * kv, kNope + kV, kv, c, row.data());
        float* kt = e.k.data() + (size_t{t} * heads + h) * (kNope + rope);
        std::copy_n(row.data(), kNope, kt);
        std::copy_n(c + kv, rope, kt + kNope);
        std::copy_n(row.data() + kNope, kV, e.v.data() + (size_t{t} * heads + h) * kV);
      }
    }
    ExpandedAttention(q.data(), e.k.data(), e.v.data(), tokens, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * latents.size() * 4));
  state.SetLabel("latent cache, re-expanded each step");
}

#if defined(__x86_64__) && defined(__GNUC__)
// This core's arithmetic peaks: twelve independent chains of one vector
// instruction (enough to cover its latency on both pipes), each chain a
// named variable pinned to its register by empty asms (DoNotOptimize takes
// an address, which would put it in memory). Kept as an array, GCC left the
// chains in memory, a load and a store around every instruction: that
// measured 26-29 G float multiply-adds/s here, 4.5x under the real peak,
// and made the kernels look closer to it than they were (load/README.md,
// "The peaks, measured again").
#define KVTIER_TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define KVTIER_CHAIN(k) auto c##k = a;
#define KVTIER_KEEP(k) asm volatile("" : : "v"(c##k));
// Twelve chains from `a`, each stepped by STEP(k) kPeakRounds times a
// benchmark iteration; items: `per_step` multiply-adds a step.
#define KVTIER_PEAK_LOOP(STEP, per_step)    \
  KVTIER_TWELVE(KVTIER_CHAIN)               \
  for (auto _ : state) {                    \
    for (int r = 0; r < kPeakRounds; ++r) { \
      KVTIER_TWELVE(STEP)                   \
    }                                       \
  }                                         \
  KVTIER_TWELVE(KVTIER_KEEP)                \
  state.SetItemsProcessed(state.iterations() * int64_t{kPeakRounds} * 12 * (per_step));
constexpr int kPeakRounds = 1 << 14;

// Float multiply-adds: 16 a zmm FMA (AVX-512), 8 a ymm FMA (AVX2).
__attribute__((target("avx512f"))) void FmaLoop512(benchmark::State& state) {
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
#define KVTIER_STEP(k)                \
  c##k = _mm512_fmadd_ps(c##k, a, b); \
  asm volatile("" : "+v"(c##k));
  KVTIER_PEAK_LOOP(KVTIER_STEP, 16)
#undef KVTIER_STEP
}

__attribute__((target("avx2,fma"))) void FmaLoop256(benchmark::State& state) {
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
#define KVTIER_STEP(k)                \
  c##k = _mm256_fmadd_ps(c##k, a, b); \
  asm volatile("" : "+x"(c##k));
  KVTIER_PEAK_LOOP(KVTIER_STEP, 8)
#undef KVTIER_STEP
}

// items_per_second = float multiply-adds/s, the unit of BM_Gemm below.
void BM_FmaPeak(benchmark::State& state) {
  if (__builtin_cpu_supports("avx512f")) {
    FmaLoop512(state);
  } else if (__builtin_cpu_supports("fma")) {
    FmaLoop256(state);
  } else {
    state.SkipWithError("no FMA on this CPU");
  }
}

// The int8 path's arithmetic roofline: int16 multiply-adds through vpdpwssd
// (32 an instruction).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void VnniLoop(benchmark::State& state) {
  const __m512i a = _mm512_set1_epi32(0x00020003), b = _mm512_set1_epi32(0x00010001);
#define KVTIER_STEP(k)                    \
  c##k = _mm512_dpwssd_epi32(c##k, a, b); \
  asm volatile("" : "+v"(c##k));
  KVTIER_PEAK_LOOP(KVTIER_STEP, 32)
#undef KVTIER_STEP
}

void BM_VnniPeak(benchmark::State& state) {
  if (!__builtin_cpu_supports("avx512vnni")) {
    state.SkipWithError("no AVX-512 VNNI on this CPU");
    return;
  }
  VnniLoop(state);
}
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_VnniPeak)->Unit(benchmark::kMillisecond);
#endif

// Reads the same blocks once (a sum of 64-bit words): the bandwidth bound.
void BM_ReadBandwidth(benchmark::State& state) {
  const Context& ctx = GetContext(Codec::kInt8, static_cast<uint32_t>(state.range(0)));
  for (auto _ : state) {
    uint64_t sum = 0;
    for (const auto& p : ctx.payloads) {
      const size_t words = p.size() / 8;
      for (size_t i = 0; i < words; ++i) {
        uint64_t w;
        std::memcpy(&w, p.data() + 8 * i, 8);
        sum += w;
      }
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * ctx.bytes));
}

void Args(benchmark::internal::Benchmark* b) {
  for (int codec : {1, 2, 3, 4}) {
    for (int tokens : {1024, 4096, 16384}) b->Args({codec, tokens});
  }
}

BENCHMARK(BM_Absorbed)->Apply(Args)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AbsorbedTwoThreads)->Apply(Args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Naive)->Arg(1024)->Arg(4096)->Arg(16384)->Unit(benchmark::kMillisecond);
// 16k would take seconds a step (34 G multiply-adds of re-expansion).
BENCHMARK(BM_LatentReexpanded)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReadBandwidth)->Arg(16384)->Unit(benchmark::kMillisecond);

// The runtime's projections: kernels::Gemm of a 3072 x 2048 weight (V2-Lite's
// q_proj) against 1 and 8 inputs (decode batches), 32, 256 and 2,048 (prefill),
// one thread; items = multiply-adds, next to FmaPeak above.
void BM_Gemm(benchmark::State& state) {
  const size_t rows = 3072, cols = 2048, n = static_cast<size_t>(state.range(0));
  std::vector<float> w(rows * cols, 0.5f), x(n * cols, 0.25f), y(n * rows);
  for (auto _ : state) {
    kvtier::kernels::Gemm(w.data(), rows, cols, x.data(), n, cols, y.data(), rows);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * rows * cols * n));
}
BENCHMARK(BM_Gemm)->Arg(1)->Arg(8)->Arg(32)->Arg(256)->Arg(2048)->Unit(benchmark::kMillisecond);

// Gemm with bf16 weights (what the CPU runtime keeps from a bf16
// checkpoint): half the bytes for the same multiply-adds.
void BM_GemmBf16(benchmark::State& state) {
  const size_t rows = 3072, cols = 2048, n = static_cast<size_t>(state.range(0));
  std::vector<uint16_t> w(rows * cols, 0x3f00);  // 0.5
  std::vector<float> x(n * cols, 0.25f), y(n * rows);
  for (auto _ : state) {
    kvtier::kernels::GemmBf16(w.data(), rows, cols, x.data(), n, cols, y.data(), rows);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * rows * cols * n));
}
BENCHMARK(BM_GemmBf16)->Arg(1)->Arg(4)->Arg(8)->Arg(16)->Arg(32)->Arg(256)->Unit(benchmark::kMillisecond);

// Gemm with FP8 weights and 128 x 128 block scales (DeepSeek-V3's): a
// quarter of float32's bytes, widened on the CPU. Random codes (no NaN) and
// scales, since the widening's cost does not depend on them.
void BM_GemmFp8(benchmark::State& state) {
  const size_t rows = 3072, cols = 2048, n = static_cast<size_t>(state.range(0));
  std::mt19937 rng(7);
  std::vector<uint8_t> codes(rows * cols);
  for (auto& c : codes) c = static_cast<uint8_t>(rng() % 0x7f) | static_cast<uint8_t>(rng() & 0x80);
  std::vector<float> scales((rows / 128) * (cols / 128), 1.0f / 448.0f), x(n * cols, 0.25f), y(n * rows);
  const kvtier::kernels::Fp8BlockScaled w{codes.data(), scales.data(), 128, 128};
  for (auto _ : state) {
    kvtier::kernels::GemmFp8(w, rows, cols, x.data(), n, cols, y.data(), rows);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * rows * cols * n));
}
BENCHMARK(BM_GemmFp8)->Arg(1)->Arg(4)->Arg(8)->Arg(16)->Arg(32)->Arg(256)->Unit(benchmark::kMillisecond);

// One layer's attention for a fresh prefill of `tokens` tokens in the
// expanded form (what prefill passes take), one thread; items are the
// multiply-adds MlaFormCosts counts for it, comparable with FmaPeak's.
void BM_ExpandedPrefill(benchmark::State& state) {
  const kvtier::kernels::MlaDims d{16, 128, 64, 128, 512};
  const size_t tokens = static_cast<size_t>(state.range(0)), dim = d.kv + d.rope;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  const auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  const std::vector<float> w_uk = random(d.heads * d.nope * d.kv), w_uv = random(d.heads * d.v * d.kv);
  const std::vector<float> context = random(tokens * dim), q = random(tokens * d.heads * (d.nope + d.rope)),
                           q_pe = random(tokens * d.heads * d.rope);
  std::vector<int64_t> positions(tokens);
  for (size_t t = 0; t < tokens; ++t) positions[t] = static_cast<int64_t>(t);
  std::vector<float> out(tokens * d.heads * d.v);
  for (auto _ : state) {
    kvtier::kernels::ExpandedAttention(d, w_uk.data(), w_uv.data(), context, tokens, positions.data(), q.data(),
                                       q_pe.data(), 0.07f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  const double visible = static_cast<double>(tokens) * static_cast<double>(tokens + 1) / 2;
  state.SetItemsProcessed(static_cast<int64_t>(static_cast<double>(state.iterations()) *
                                               kvtier::kernels::MlaFormCosts(d, tokens, tokens, visible).expanded));
}
BENCHMARK(BM_ExpandedPrefill)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond);

// DeepSeek-V4-Flash's attention for one decode row on the CPU (64 heads of
// 512 over its window of 128 entries, and with the 512 compressed entries
// its indexer picks), one thread; items are the multiply-adds (scores and
// weighted sums), comparable with FmaPeak's.
void BM_SinkAttention(benchmark::State& state) {
  const kvtier::kernels::SinkAttentionShape shape{64, 512, 1.0f / std::sqrt(512.0f)};
  const size_t count = static_cast<size_t>(state.range(0));
  std::mt19937_64 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(size_t{shape.heads} * shape.dim), entries(count * shape.dim), sinks(shape.heads);
  for (float& x : q) x = normal(rng);
  for (float& x : entries) x = normal(rng);
  for (float& x : sinks) x = normal(rng);
  std::vector<float> out(q.size());
  for (auto _ : state) {
    kvtier::kernels::SinkAttention(shape, q.data(), entries.data(), count, sinks.data(), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * 2 * shape.heads * count * shape.dim));
}
BENCHMARK(BM_SinkAttention)->Arg(128)->Arg(640)->Unit(benchmark::kMillisecond);

// V4-Flash's indexer scoring one decode row's compressed keys (64 heads of
// 128; a key every 4 tokens: 4,096 keys at 16k tokens, 16,384 at 64k), one
// thread; items are the multiply-adds.
void BM_V4IndexerScores(benchmark::State& state) {
  const uint32_t heads = 64, dim = 128;
  const size_t count = static_cast<size_t>(state.range(0));
  std::mt19937_64 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(size_t{heads} * dim), weights(heads), keys(count * dim), scores(count);
  for (float& x : q) x = normal(rng);
  for (float& x : weights) x = normal(rng);
  for (float& x : keys) x = normal(rng);
  for (auto _ : state) {
    kvtier::kernels::V4IndexerScores(heads, dim, q.data(), weights.data(), keys.data(), count, scores.data());
    benchmark::DoNotOptimize(scores.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * heads * count * dim));
}
BENCHMARK(BM_V4IndexerScores)->Arg(4096)->Arg(16384)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
