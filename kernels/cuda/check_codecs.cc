// GPU codec check and benchmark, for the device machine (no gtest there):
// on fresh random latents with outlier channels, in three block shapes (the
// 16-byte kernels' and the per-value fallbacks'), the CUDA codecs' bytes
// must equal the CPU codecs' bytes exactly, and their decoded floats too
// (outputs poisoned first, so an element never written fails); then a
// table of quantize/dequantize GB/s against a device-to-device cudaMemcpy of
// the same float bytes, measured in the same run.
// Exit codes: 0 pass, 1 mismatch or CUDA error, 77 no device (ctest: skip).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check_util.h"
#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/cuda_codec.h"

namespace kvtier::kernels {
namespace {

constexpr BlockShape kShape{64, 512, 64};  // one layer of one V2-Lite block

bool Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

std::vector<float> RandomLatents(BlockShape shape, size_t blocks, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(shape.values() * blocks);
  for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (i % shape.dim() == 7 ? 30.0f : 1.0f);
  return x;
}

// CPU and GPU agree byte for byte on `blocks` blocks; returns false (and
// says where) when they do not.
bool SameAsCpu(Codec codec, BlockShape shape, size_t blocks, uint64_t seed) {
  const std::vector<float> x = RandomLatents(shape, blocks, seed);
  const size_t bytes = EncodedBytes(codec, shape);
  std::vector<uint8_t> want(bytes * blocks);
  std::vector<float> want_back(x.size());
  for (size_t b = 0; b < blocks; ++b) {
    const std::span<const float> in(x.data() + b * shape.values(), shape.values());
    if (!Quantize(codec, shape, in, std::span(want.data() + b * bytes, bytes)).ok() ||
        !Dequantize(codec, shape, std::span(want.data() + b * bytes, bytes),
                    std::span(want_back.data() + b * shape.values(), shape.values()))
             .ok()) {
      std::fprintf(stderr, "CPU codec failed\n");
      return false;
    }
  }
  float* d_x = nullptr;
  uint8_t* d_codes = nullptr;
  float* d_back = nullptr;
  if (!Check(cudaMalloc(&d_x, x.size() * 4), "cudaMalloc") || !Check(cudaMalloc(&d_codes, want.size()), "cudaMalloc") ||
      !Check(cudaMalloc(&d_back, x.size() * 4), "cudaMalloc")) {
    return false;
  }
  cudaMemcpy(d_x, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(d_codes, 0xAB, want.size());  // poison: every byte must be written
  cudaMemset(d_back, 0xFF, x.size() * 4);
  Status q = cuda::Quantize(codec, shape, d_x, d_codes, blocks, nullptr);
  Status d = q.ok() ? cuda::Dequantize(codec, shape, d_codes, d_back, blocks, nullptr) : q;
  std::vector<uint8_t> got(want.size());
  std::vector<float> got_back(x.size());
  cudaMemcpy(got.data(), d_codes, got.size(), cudaMemcpyDeviceToHost);
  cudaMemcpy(got_back.data(), d_back, got_back.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(d_x), cudaFree(d_codes), cudaFree(d_back);
  if (!d.ok()) {
    std::fprintf(stderr, "%s: %s\n", CodecName(codec), d.message().c_str());
    return false;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      std::fprintf(stderr, "%s: byte %zu (block %zu) is %u on the GPU, %u on the CPU\n", CodecName(codec), i, i / bytes,
                   got[i], want[i]);
      return false;
    }
  }
  if (std::memcmp(got_back.data(), want_back.data(), got_back.size() * 4) != 0) {
    std::fprintf(stderr, "%s: decoded floats differ from the CPU's\n", CodecName(codec));
    return false;
  }
  return true;
}

// Bandwidth: 4,096 blocks (151 MB of float latents).
void Benchmark() {
  constexpr size_t kBlocks = 4096;
  const size_t floats = kShape.values() * kBlocks;
  float *d_x = nullptr, *d_copy = nullptr;
  uint8_t* d_codes = nullptr;
  cudaMalloc(&d_x, floats * 4);
  cudaMalloc(&d_copy, floats * 4);
  cudaMalloc(&d_codes, floats * 2);
  const std::vector<float> x = RandomLatents(kShape, 64, 7);
  for (size_t b = 0; b < kBlocks; b += 64)
    cudaMemcpy(d_x + b * kShape.values(), x.data(), x.size() * 4, cudaMemcpyHostToDevice);
  const double copy_gbs = cuda::DeviceCopyGBs(floats * 4);
  std::printf("\n%-6s %14s %10s %16s %10s\n", "codec", "quantize GB/s", "% copy", "dequantize GB/s", "% copy");
  for (Codec codec : kAllCodecs) {
    // Bytes moved: float latents read and codes written (or the reverse).
    const double moved = static_cast<double>(floats) * 4 + static_cast<double>(EncodedBytes(codec, kShape)) * kBlocks;
    const double q =
        check::Milliseconds([&] { (void)cuda::Quantize(codec, kShape, d_x, d_codes, kBlocks, nullptr); }, 20);
    const double d =
        check::Milliseconds([&] { (void)cuda::Dequantize(codec, kShape, d_codes, d_copy, kBlocks, nullptr); }, 20);
    std::printf("%-6s %14.1f %9.0f%% %16.1f %9.0f%%\n", CodecName(codec), moved / q / 1e6,
                100 * moved / q / 1e6 / copy_gbs, moved / d / 1e6, 100 * moved / d / 1e6 / copy_gbs);
  }
  std::printf("device-to-device cudaMemcpy, same run: %.1f GB/s (read + write)\n", copy_gbs);
  cudaFree(d_x), cudaFree(d_copy), cudaFree(d_codes);
}

int Main(bool benchmark) {
  if (!check::DeviceOrSkip("the CUDA codecs were")) return 77;
  bool ok = true;
  // V2's blocks take the 16-byte kernels; 33 tokens of 128 + 8 too (an odd
  // number of fp8 tiles, token groups cut short); 5 of 30 + 7 the others.
  for (const BlockShape shape : {kShape, BlockShape{33, 128, 8}, BlockShape{5, 30, 7}}) {
    for (Codec codec : kAllCodecs) {
      for (size_t blocks : {size_t{1}, size_t{3}, size_t{257}}) {
        const bool same = SameAsCpu(codec, shape, blocks, 1000 + blocks);
        std::printf("%-5s %2u x (%u + %u), %4zu blocks: %s\n", CodecName(codec), shape.tokens, shape.latent_dim,
                    shape.rope_dim, blocks, same ? "same bytes as the CPU" : "MISMATCH");
        ok = ok && same;
      }
    }
  }
  if (benchmark) Benchmark();
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::kernels

int main(int argc, char** argv) { return kvtier::kernels::Main(kvtier::kernels::check::WantBenchmark(argc, argv)); }
