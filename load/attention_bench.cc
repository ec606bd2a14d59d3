// Absorbed MLA decode attention, one layer-step at DeepSeek-V2-Lite dims (16
// heads, 512 + 64), against this machine's memory read bandwidth measured in
// the same run over the same bytes: the roofline of a memory-bound kernel.
//
//   attention_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/kernels/mla_attention.h"

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

void BM_Absorbed(benchmark::State& state) {
  const Codec codec = static_cast<Codec>(state.range(0));
  const auto tokens = static_cast<uint32_t>(state.range(1));
  const Context& ctx = GetContext(codec, tokens);
  std::vector<float> q(kShape.heads * kShape.kv_lora_rank, 0.01f), qr(kShape.heads * kShape.rope_dim, 0.01f),
      out(kShape.heads * kShape.kv_lora_rank);
  for (auto _ : state) {
    (void)kvtier::kernels::AbsorbedMlaDecode(kShape, q, qr, 0.07f, ctx.blocks, {}, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * ctx.bytes));
  state.SetLabel(kvtier::kernels::CodecName(codec));
}

// Two threads, each taking half of the heads (the blocks are shared, read by
// both).
void BM_AbsorbedTwoThreads(benchmark::State& state) {
  const Codec codec = static_cast<Codec>(state.range(0));
  const auto tokens = static_cast<uint32_t>(state.range(1));
  const Context& ctx = GetContext(codec, tokens);
  constexpr kvtier::kernels::MlaShape kHalf{kShape.heads / 2, kShape.kv_lora_rank, kShape.rope_dim};
  std::vector<float> q(kShape.heads * kShape.kv_lora_rank, 0.01f), qr(kShape.heads * kShape.rope_dim, 0.01f),
      out(kShape.heads * kShape.kv_lora_rank);
  const size_t ql = kHalf.heads * kHalf.kv_lora_rank, qp = kHalf.heads * kHalf.rope_dim;
  auto half = [&](int i) {
    (void)kvtier::kernels::AbsorbedMlaDecode(kHalf, std::span(q).subspan(i * ql, ql),
                                             std::span(qr).subspan(i * qp, qp), 0.07f, ctx.blocks, {},
                                             std::span(out).subspan(i * ql, ql));
  };
  for (auto _ : state) {
    std::thread other(half, 1);
    half(0);
    other.join();
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * ctx.bytes));
  state.SetLabel(std::string(kvtier::kernels::CodecName(codec)) + " 2 threads");
}

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
  for (int codec : {1, 3, 4}) {
    for (int tokens : {1024, 4096, 16384}) b->Args({codec, tokens});
  }
}

BENCHMARK(BM_Absorbed)->Apply(Args)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AbsorbedTwoThreads)->Apply(Args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ReadBandwidth)->Arg(16384)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
