// Sampling one token from a real vocabulary's logits (what the decode
// worker does on the CPU for every sequence of every step, whatever device
// ran the model), against one pass over the same logits (finding the
// largest): the floor any sampler has to read.
//
// BM_SampleEach draws a decode step's 32 tokens on 1 and 2 kernel threads.
//
//   sampler_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kvtier/kernels/parallel.h"
#include "services/runtime/sampler.h"

namespace {

// Logits like a trained model's: a few tokens well ahead of a long tail.
std::vector<float> Logits(size_t vocab) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> tail(0.0f, 2.0f);
  std::vector<float> logits(vocab);
  for (float& v : logits) v = tail(rng);
  for (int i = 0; i < 8; ++i) logits[rng() % vocab] = 12.0f + static_cast<float>(i);
  return logits;
}

// Args: vocabulary, temperature x 100, top_p x 100, top logprobs.
void BM_Sample(benchmark::State& state) {
  const std::vector<float> logits = Logits(static_cast<size_t>(state.range(0)));
  const kvtier::runtime::Sampling sampling{static_cast<float>(state.range(1)) / 100,
                                           static_cast<float>(state.range(2)) / 100, 7};
  uint64_t step = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(kvtier::runtime::Sample(logits, sampling, step++, static_cast<size_t>(state.range(3))));
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_Sample)
    ->ArgNames({"vocab", "temp", "top_p", "top_n"})
    ->Args({102400, 0, 100, 0})
    ->Args({102400, 0, 100, 5})
    ->Args({102400, 70, 90, 0})
    ->Args({102400, 100, 100, 0})
    ->Args({129280, 0, 100, 0});

// A decode step's tokens: `sequences` greedy draws with 5 top logprobs,
// through SampleEach on `threads` kernel threads (the decode worker's way).
void BM_SampleEach(benchmark::State& state) {
  const size_t sequences = static_cast<size_t>(state.range(0));
  kvtier::kernels::SetKernelThreads(static_cast<size_t>(state.range(1)));
  std::vector<std::vector<float>> logits(sequences, Logits(102400));
  const kvtier::runtime::Sampling greedy;
  std::vector<kvtier::runtime::SampleRequest> requests;
  for (size_t i = 0; i < sequences; ++i) requests.push_back({logits[i], &greedy, i, 5});
  for (auto _ : state) benchmark::DoNotOptimize(kvtier::runtime::SampleEach(requests));
  kvtier::kernels::SetKernelThreads(1);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * sequences));
}
BENCHMARK(BM_SampleEach)->ArgNames({"sequences", "threads"})->Args({32, 1})->Args({32, 2});

void BM_OnePass(benchmark::State& state) {
  const std::vector<float> logits = Logits(static_cast<size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(*std::max_element(logits.begin(), logits.end()));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_OnePass)->ArgNames({"vocab"})->Arg(102400)->Arg(129280);

}  // namespace

BENCHMARK_MAIN();
