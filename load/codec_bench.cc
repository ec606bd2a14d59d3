// Codec throughput against memcpy, one core, side by side in one run.
//
// Each iteration passes over kBlocks blocks of one layer at DeepSeek-V2-Lite
// dims (64 tokens x (512 + 64) float32 = 144 KiB a block, 36 MiB in all, far
// beyond the caches). Throughput counts the float32 bytes of the latents for
// every row, memcpy included (it copies those same float32 bytes), so the
// ratios at the end compare equal work.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kvtier/kernels/codec.h"
#include "services/kvblock/crc32c.h"

namespace {

using kvtier::kernels::BlockShape;
using kvtier::kernels::Codec;

constexpr BlockShape kShape{64, 512, 64};
constexpr size_t kBlocks = 256;

const std::vector<float>& Latents() {
  static const std::vector<float> data = [] {
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(kBlocks * kShape.values());
    for (size_t i = 0; i < v.size(); ++i) v[i] = normal(rng) * (i % 97 == 0 ? 30.0f : 1.0f);
    return v;
  }();
  return data;
}

size_t FloatBytes() { return kBlocks * kShape.values() * sizeof(float); }

void BM_Memcpy(benchmark::State& state) {
  const std::vector<float>& in = Latents();
  std::vector<float> out(in.size(), 1.0f);
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), FloatBytes());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * FloatBytes()));
}

void BM_Quantize(benchmark::State& state) {
  const Codec codec = static_cast<Codec>(state.range(0));
  const std::vector<float>& in = Latents();
  const size_t block_bytes = kvtier::kernels::EncodedBytes(codec, kShape);
  std::vector<uint8_t> out(kBlocks * block_bytes, 1);
  for (auto _ : state) {
    for (size_t b = 0; b < kBlocks; ++b) {
      const auto s =
          kvtier::kernels::Quantize(codec, kShape, std::span(in).subspan(b * kShape.values(), kShape.values()),
                                    std::span(out).subspan(b * block_bytes, block_bytes));
      if (!s.ok()) state.SkipWithError(s.message().c_str());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * FloatBytes()));
  state.SetLabel(kvtier::kernels::CodecName(codec));
}

void BM_Dequantize(benchmark::State& state) {
  const Codec codec = static_cast<Codec>(state.range(0));
  const std::vector<float>& in = Latents();
  const size_t block_bytes = kvtier::kernels::EncodedBytes(codec, kShape);
  std::vector<uint8_t> encoded(kBlocks * block_bytes);
  for (size_t b = 0; b < kBlocks; ++b) {
    (void)kvtier::kernels::Quantize(codec, kShape, std::span(in).subspan(b * kShape.values(), kShape.values()),
                                    std::span(encoded).subspan(b * block_bytes, block_bytes));
  }
  std::vector<float> out(in.size(), 1.0f);
  for (auto _ : state) {
    for (size_t b = 0; b < kBlocks; ++b) {
      const auto s =
          kvtier::kernels::Dequantize(codec, kShape, std::span(encoded).subspan(b * block_bytes, block_bytes),
                                      std::span(out).subspan(b * kShape.values(), kShape.values()));
      if (!s.ok()) state.SkipWithError(s.message().c_str());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * FloatBytes()));
  state.SetLabel(kvtier::kernels::CodecName(codec));
}

// CRC32C of one int8 V2-Lite block record (27 layers, ~1 MB): every Get and
// tier move verifies one.
void BM_Crc32c(benchmark::State& state) {
  const std::vector<float>& in = Latents();
  const size_t bytes = 1026468;
  const auto* data = reinterpret_cast<const uint8_t*>(in.data());
  size_t offset = 0;
  uint32_t crc = 0;
  for (auto _ : state) {
    crc ^= kvtier::kvblock::Crc32c(data + offset, bytes);
    offset = (offset + bytes) % (FloatBytes() - bytes);
  }
  benchmark::DoNotOptimize(crc);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_Crc32c)->MinTime(0.5);

void CodecArgs(benchmark::internal::Benchmark* b) {
  for (Codec c : kvtier::kernels::kAllCodecs) b->Arg(static_cast<int>(c));
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(BM_Quantize)->Apply(CodecArgs)->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(BM_Dequantize)->Apply(CodecArgs)->Unit(benchmark::kMillisecond)->MinTime(0.5);

// Prints Google Benchmark's table, then the ratios to memcpy.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration) continue;
      const auto it = r.counters.find("bytes_per_second");
      if (it == r.counters.end()) continue;
      const std::string name = r.benchmark_name();
      const std::string kind = name.substr(0, name.find('/'));
      gbps_[kind][r.report_label] = it->second.value / 1e9;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    const double memcpy_gbps = gbps_["BM_Memcpy"][""];
    std::printf("\nV2-Lite layer blocks (64 x 576 float32), one core, %zu MiB working set\n", FloatBytes() >> 20);
    std::printf("memcpy of the same float32 bytes: %.2f GB/s\n\n", memcpy_gbps);
    std::printf("%-6s %14s %10s %16s %10s\n", "codec", "quantize GB/s", "% memcpy", "dequantize GB/s", "% memcpy");
    for (Codec c : kvtier::kernels::kAllCodecs) {
      const std::string n = kvtier::kernels::CodecName(c);
      const double q = gbps_["BM_Quantize"][n], d = gbps_["BM_Dequantize"][n];
      std::printf("%-6s %14.2f %9.0f%% %16.2f %9.0f%%\n", n.c_str(), q, 100 * q / memcpy_gbps, d,
                  100 * d / memcpy_gbps);
    }
    std::printf("targets: quantize >= 40%%, dequantize >= 60%% of memcpy\n");
    const double crc = gbps_["BM_Crc32c"][""];
    std::printf("\nCRC32C of 1 MB records (reads only): %.2f GB/s, %.0f%% of memcpy\n", crc, 100 * crc / memcpy_gbps);
  }

 private:
  std::map<std::string, std::map<std::string, double>> gbps_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
