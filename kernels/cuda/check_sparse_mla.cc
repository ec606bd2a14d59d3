// GPU check and benchmark of DeepSeek-V3.2's sparse attention kernels
// (cuda_sparse_mla.h), for the device machine (no gtest there), on fresh
// random inputs:
// - indexer scores against float64 and the CPU's IndexerScores, within
//   2e-5 of scale * sum_h |w_h| sum_d |q_hd k_d| (float32's bound for sums
//   of 128 and 64 terms; how many are the CPU's bits is printed), head dims
//   16 and 128, keys with exact duplicates;
// - the top-k choice, given the same scores, exactly the CPU's
//   SelectTopTokens (sorted), on those scores and on scores full of ties,
//   +-0 and negatives, rows shorter and longer than k;
// - the gathered latents bit for bit the CPU's DequantizeTokens (blocks
//   through a shuffled table, float tails, every codec), and attention over
//   them (a tail-only PagedMlaDecode) within 1e-4 of the CPU's
//   AbsorbedMlaDecode over the same rows; with every token chosen, within
//   1e-4 of the dense CUDA-core attention over the blocks; the same tokens
//   gathered into bf16 blocks and a float tail (GatherLatentBlocks): their
//   bits, and attention over them within 1e-2 of the float rows';
// - a chosen token past its sequence comes back INVALID_ARGUMENT.
// Then a table: one layer's decode attention at a 64k-token context, dense
// (every latent, tensor cores) against the sparse step (every key scored,
// 2,048 tokens chosen, gathered into bf16 blocks and attended on tensor
// cores, as the runtime does), V3.2's shapes (128 heads,
// 512 + 64 latents, a 64-head indexer of 128 dims), batch 1-128.
// Exit codes: 0 pass, 1 mismatch or CUDA error, 77 no device (ctest: skip).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "check_util.h"
#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/cuda_device.h"
#include "kvtier/kernels/cuda_mla_attention.h"
#include "kvtier/kernels/cuda_sparse_mla.h"
#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/indexer.h"
#include "kvtier/kernels/mla_attention.h"

namespace kvtier::kernels {
namespace {

using check::ToDevice;
using check::ToHost;

std::vector<float> Random(size_t n, std::mt19937_64& rng, float range = 1.0f) {
  std::uniform_real_distribution<float> d(-range, range);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

// FP8 codes and one scale per group of `dim`, as the indexer rounds keys and queries.
void RoundFp8(const std::vector<float>& x, uint32_t dim, std::vector<uint8_t>& codes, std::vector<float>& scales) {
  codes.resize(x.size());
  scales.resize(x.size() / dim);
  (void)QuantizeIndexerFp8(x, dim, codes, scales);
}

// Top-k rows on the GPU against the CPU's choice over the same scores.
bool SelectionMatches(const std::vector<float>& scores, uint32_t max_visible, const std::vector<int32_t>& visible,
                      uint32_t k, int32_t* d_visible_or_null) {
  const uint32_t rows = static_cast<uint32_t>(visible.size());
  float* d_scores = ToDevice(scores);
  int32_t* d_visible = d_visible_or_null != nullptr ? d_visible_or_null : ToDevice(visible);
  int32_t *d_selected = nullptr, *d_counts = nullptr;
  cudaMalloc(&d_selected, size_t{rows} * k * 4);
  cudaMalloc(&d_counts, size_t{rows} * 4);
  const Status status = cuda::SelectTopTokens(rows, d_scores, max_visible, d_visible, k, d_selected, d_counts, nullptr);
  const std::vector<int32_t> selected = ToHost(d_selected, size_t{rows} * k), counts = ToHost(d_counts, rows);
  bool ok = status.ok() && cudaDeviceSynchronize() == cudaSuccess;
  for (uint32_t r = 0; ok && r < rows; ++r) {
    std::vector<uint32_t> want;
    SelectTopTokens(std::span(scores).subspan(size_t{r} * max_visible, static_cast<size_t>(visible[r])), k, want);
    std::sort(want.begin(), want.end());
    ok = counts[r] == static_cast<int32_t>(want.size()) &&
         std::equal(want.begin(), want.end(), selected.begin() + size_t{r} * k,
                    [](uint32_t a, int32_t b) { return static_cast<int32_t>(a) == b; });
    if (!ok) std::printf("  row %u (%d visible, k %u): the GPU chose other tokens\n", r, visible[r], k);
  }
  cudaFree(d_scores);
  if (d_visible_or_null == nullptr) cudaFree(d_visible);
  cudaFree(d_selected);
  cudaFree(d_counts);
  return ok;
}

// Scores of rows over keys with duplicates, then the choice from them.
bool CheckScores(uint32_t heads, uint32_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  constexpr uint32_t kKeys = 3000, kTopK = 64;
  const std::vector<int64_t> offsets = {0, 100, 7, 2500, 0};
  const std::vector<int32_t> visible = {3000, 1, 700, 500, 64};
  const uint32_t rows = static_cast<uint32_t>(offsets.size());
  std::vector<float> key_values = Random(size_t{kKeys} * dim, rng);
  for (uint32_t t = 1; t < kKeys; t += 9) {  // exact ties
    std::copy_n(key_values.begin() + (t - 1) * dim, dim, key_values.begin() + size_t{t} * dim);
  }
  std::vector<uint8_t> keys, q_codes;
  std::vector<float> key_scales, q_scales;
  RoundFp8(key_values, dim, keys, key_scales);
  RoundFp8(Random(size_t{rows} * heads * dim, rng, 3.0f), dim, q_codes, q_scales);
  const std::vector<float> weights = Random(size_t{rows} * heads, rng);
  uint8_t* d_keys = ToDevice(keys);
  uint8_t* d_q = ToDevice(q_codes);
  float *d_key_scales = ToDevice(key_scales), *d_weights = ToDevice(weights);
  int64_t* d_offsets = ToDevice(offsets);
  int32_t* d_visible = ToDevice(visible);
  float* d_scores = nullptr;
  cudaMalloc(&d_scores, size_t{rows} * kKeys * 4);
  cudaMemset(d_scores, 0, size_t{rows} * kKeys * 4);
  const cuda::IndexerKeys ik{d_keys, d_key_scales, d_offsets, d_visible, kKeys};
  const Status status = cuda::IndexerScores(heads, dim, rows, d_q, d_weights, ik, d_scores, nullptr);
  const std::vector<float> scores = ToHost(d_scores, size_t{rows} * kKeys);
  bool ok = status.ok() && cudaDeviceSynchronize() == cudaSuccess;
  if (!status.ok()) std::printf("  IndexerScores: %s\n", status.message().c_str());
  double worst = 0;
  size_t same_bits = 0, total = 0;
  for (uint32_t r = 0; ok && r < rows; ++r) {
    const size_t n = static_cast<size_t>(visible[r]), first = static_cast<size_t>(offsets[r]);
    std::vector<float> cpu(n);
    (void)IndexerScores(heads, dim, std::span(q_codes).subspan(size_t{r} * heads * dim, size_t{heads} * dim),
                        std::span(weights).subspan(size_t{r} * heads, heads),
                        std::span(keys).subspan(first * dim, n * dim), std::span(key_scales).subspan(first, n), cpu);
    for (size_t t = 0; t < n; ++t) {
      double exact = 0, magnitude = 0;
      for (uint32_t h = 0; h < heads; ++h) {
        double dot = 0, size = 0;
        for (uint32_t d = 0; d < dim; ++d) {
          const double product = double(Fp8E4m3ToFloat(q_codes[(size_t{r} * heads + h) * dim + d])) *
                                 Fp8E4m3ToFloat(keys[(first + t) * dim + d]);
          dot += product, size += std::fabs(product);
        }
        exact += weights[size_t{r} * heads + h] * std::max(dot, 0.0);
        magnitude += std::fabs(weights[size_t{r} * heads + h]) * size;
      }
      exact *= key_scales[first + t], magnitude *= key_scales[first + t];
      const float gpu = scores[size_t{r} * kKeys + t];
      const double error = std::fabs(gpu - exact) / std::max(magnitude, 1e-30);
      worst = std::max(worst, error);
      ok = ok && error <= 2e-5 && std::fabs(cpu[t] - exact) <= 2e-5 * std::max(magnitude, 1e-30);
      same_bits += gpu == cpu[t], ++total;
    }
  }
  std::printf("indexer scores, %2u heads of %3u: %s (largest error %.1e of the scale; %zu of %zu the CPU's bits)\n",
              heads, dim, ok ? "match float64 and the CPU" : "MISMATCH", worst, same_bits, total);
  const bool chosen = ok && SelectionMatches(scores, kKeys, visible, kTopK, d_visible);
  std::printf("top %u from them: %s\n", kTopK, chosen ? "the CPU's tokens" : "WRONG");
  cudaFree(d_keys), cudaFree(d_q), cudaFree(d_key_scales), cudaFree(d_weights), cudaFree(d_offsets);
  cudaFree(d_visible), cudaFree(d_scores);
  return ok && chosen;
}

// Scores drawn from a few values (ties everywhere), with +-0.
bool CheckSelectionTies() {
  std::mt19937_64 rng(11);
  const std::vector<int32_t> visible = {5000, 2048, 2049, 17, 4096};
  const uint32_t max_visible = 5000;
  const float values[] = {-0.0f, 0.0f, 1.5f, -2.0f, 1.5f, 3.25f, -0.0f, 7.0f, 0.5f};
  std::uniform_int_distribution<int> pick(0, 8);
  std::vector<float> scores(visible.size() * max_visible);
  for (float& s : scores) s = values[pick(rng)];
  bool ok = true;
  for (uint32_t k : {1u, 16u, 2048u}) ok = ok && SelectionMatches(scores, max_visible, visible, k, nullptr);
  std::printf("top k of tied scores (k 1, 16, 2048): %s\n", ok ? "the CPU's tokens" : "WRONG");
  return ok;
}

constexpr uint32_t kKv = 512, kRope = 64, kDim = kKv + kRope, kTpb = 64, kHeads = 16;
constexpr BlockShape kShape{kTpb, kKv, kRope};

// Sequences of blocks (through a shuffled table) and tails; one row each
// choosing some of its tokens (all of them when `all`), gathered on the GPU
// and attended to; against the CPU's gather and attention, and (all) the
// dense attention.
// GatherLatentBlocks over the same choice as GatherLatents, which wrote
// `gathered` ([rows][k][kDim]): its blocks hold those values rounded to
// bf16, its tails the rest bit for bit, its table and counts say so, and
// attention over them (tensor cores where a row has a full block) lies
// within 1e-2 of `float_out`, the attention over the float rows (values
// in [-1, 1]; the tensor cores round the query and weights to fp16).
bool GatheredBlocksMatch(const MlaShape& shape, const cuda::PagedLatents& latents, uint32_t rows,
                         const int32_t* d_selected, uint32_t k, const std::vector<int32_t>& counts,
                         const int32_t* d_counts, const std::vector<float>& gathered, const float* d_q, float scale,
                         const std::vector<float>& float_out, double& worst) {
  constexpr uint32_t kPer = cuda::kGatheredBlockTokens;
  const uint32_t max_blocks = k / kPer;
  const size_t block_bytes = cuda::GatheredBlockBytes(shape), blocks = std::max<size_t>(size_t{rows} * max_blocks, 1);
  cuda::GatheredLatents g;
  g.pool = ToDevice(std::vector<uint8_t>(blocks * block_bytes, 0xff));
  g.block_table = ToDevice(std::vector<int32_t>(blocks, -1));
  g.blocks = ToDevice(std::vector<int32_t>(rows, -1));
  g.tail = ToDevice(std::vector<float>(size_t{rows} * kPer * kDim, NAN));
  g.tail_tokens = ToDevice(std::vector<int32_t>(rows, -1));
  unsigned long long* d_fault = ToDevice(std::vector<unsigned long long>{cuda::kNoPagedMlaFault});
  Status status = cuda::GatherLatentBlocks(shape, latents, rows, d_selected, k, d_counts, g, d_fault, nullptr);
  const std::vector<uint8_t> pool = ToHost(g.pool, blocks * block_bytes);
  const std::vector<int32_t> table = ToHost(g.block_table, blocks), nblocks = ToHost(g.blocks, rows),
                             tail_tokens = ToHost(g.tail_tokens, rows);
  const std::vector<float> tail = ToHost(g.tail, size_t{rows} * kPer * kDim);
  bool ok = status.ok() && ToHost(d_fault, 1)[0] == cuda::kNoPagedMlaFault;
  for (uint32_t r = 0; ok && r < rows; ++r) {
    const uint32_t count = static_cast<uint32_t>(counts[r]), full = count / kPer;
    ok = nblocks[r] == static_cast<int32_t>(full) && tail_tokens[r] == static_cast<int32_t>(count - full * kPer);
    for (uint32_t j = 0; ok && j < max_blocks; ++j)
      ok = table[r * max_blocks + j] == static_cast<int32_t>(r * max_blocks + j);
    for (uint32_t i = 0; ok && i < count; ++i) {
      const float* want = gathered.data() + (size_t{r} * k + i) * kDim;
      for (uint32_t c = 0; ok && c < kDim; ++c) {
        if (i < full * kPer) {
          uint16_t got;
          std::memcpy(
              &got, pool.data() + (size_t{r} * max_blocks + i / kPer) * block_bytes + (size_t{i % kPer} * kDim + c) * 2,
              2);
          ok = got == FloatToBf16(want[c]);
        } else {
          ok = FloatBits(tail[(size_t{r} * kPer + i - full * kPer) * kDim + c]) == FloatBits(want[c]);
        }
      }
    }
  }
  float* d_out = ToDevice(std::vector<float>(float_out.size(), NAN));
  if (ok) {
    status =
        cuda::PagedMlaDecode(shape, cuda::GatheredPagedLatents(g, rows, k), rows, d_q, scale, d_out, nullptr, nullptr);
    const std::vector<float> out = ToHost(d_out, float_out.size());
    for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, double(std::fabs(out[i] - float_out[i])));
    ok = status.ok() && worst <= 1e-2;
  }
  if (!status.ok()) std::printf("  %s\n", status.message().c_str());
  for (void* p : std::initializer_list<void*>{g.pool, g.block_table, g.blocks, g.tail, g.tail_tokens, d_fault, d_out}) {
    cudaFree(p);
  }
  return ok;
}

bool CheckGather(Codec codec, bool all, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<int32_t> blocks = {3, 0, 5, 1}, tails = {10, 7, 0, 63};
  const uint32_t rows = static_cast<uint32_t>(blocks.size()), max_blocks = 5, max_tail = 63, k = all ? 400 : 50;
  const size_t block_bytes = EncodedBytes(codec, kShape);
  const uint32_t pool_blocks = std::accumulate(blocks.begin(), blocks.end(), 0u);
  std::vector<uint32_t> slots(pool_blocks);
  std::iota(slots.begin(), slots.end(), 0u);
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<uint8_t> pool(pool_blocks * block_bytes);
  std::vector<int32_t> table(size_t{rows} * max_blocks, -1);
  std::vector<float> tail(size_t{rows} * max_tail * kDim);
  for (uint32_t r = 0, next = 0; r < rows; ++r) {
    for (int32_t b = 0; b < blocks[r]; ++b, ++next) {
      table[r * max_blocks + b] = static_cast<int32_t>(slots[next]);
      (void)Quantize(codec, kShape, Random(kShape.values(), rng),
                     std::span(pool).subspan(slots[next] * block_bytes, block_bytes));
    }
    const std::vector<float> t = Random(static_cast<size_t>(tails[r]) * kDim, rng);
    std::copy(t.begin(), t.end(), tail.begin() + size_t{r} * max_tail * kDim);
  }
  // Each row's choice, ascending, and the CPU's gathered rows.
  std::vector<int32_t> selected(size_t{rows} * k, 0), counts(rows);
  std::vector<float> want(size_t{rows} * k * kDim, 0.0f);
  for (uint32_t r = 0; r < rows; ++r) {
    const uint32_t visible = blocks[r] * kTpb + tails[r];
    std::vector<uint32_t> tokens(visible);
    std::iota(tokens.begin(), tokens.end(), 0u);
    if (!all) {
      std::shuffle(tokens.begin(), tokens.end(), rng);
      tokens.resize(std::min<size_t>(visible, k - r));
      std::sort(tokens.begin(), tokens.end());
    }
    counts[r] = static_cast<int32_t>(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      const uint32_t t = tokens[i];
      selected[size_t{r} * k + i] = static_cast<int32_t>(t);
      float* row = want.data() + (size_t{r} * k + i) * kDim;
      if (t < blocks[r] * kTpb) {
        const uint32_t slot = static_cast<uint32_t>(table[r * max_blocks + t / kTpb]), in_block = t % kTpb;
        (void)DequantizeTokens(codec, kShape, std::span(pool).subspan(slot * block_bytes, block_bytes),
                               std::span(&in_block, 1), std::span(row, kDim));
      } else {
        std::copy_n(tail.data() + (size_t{r} * max_tail + t - blocks[r] * kTpb) * kDim, kDim, row);
      }
    }
  }
  uint8_t* d_pool = ToDevice(pool);
  int32_t *d_table = ToDevice(table), *d_blocks = ToDevice(blocks), *d_tails = ToDevice(tails);
  int32_t *d_selected = ToDevice(selected), *d_counts = ToDevice(counts);
  float* d_tail = ToDevice(tail);
  const cuda::PagedLatents latents{codec,      kTpb,     d_pool, pool_blocks, d_table,
                                   max_blocks, d_blocks, d_tail, d_tails,     max_tail};
  float* d_gathered = ToDevice(std::vector<float>(want.size(), NAN));
  unsigned long long* d_fault = ToDevice(std::vector<unsigned long long>{cuda::kNoPagedMlaFault});
  const MlaShape shape{kHeads, kKv, kRope};
  Status status = cuda::GatherLatents(shape, latents, rows, d_selected, k, d_counts, d_gathered, d_fault, nullptr);
  std::vector<float> gathered = ToHost(d_gathered, want.size());
  const unsigned long long fault = ToHost(d_fault, 1)[0];
  bool ok = status.ok() && fault == cuda::kNoPagedMlaFault;
  for (uint32_t r = 0; ok && r < rows; ++r) {
    ok = std::equal(want.begin() + size_t{r} * k * kDim, want.begin() + (size_t{r} * k + counts[r]) * kDim,
                    gathered.begin() + size_t{r} * k * kDim,
                    [](float a, float b) { return FloatBits(a) == FloatBits(b); });
  }
  // Attention over the gathered rows: a tail-only launch.
  const std::vector<float> q = Random(size_t{rows} * kHeads * kDim, rng);
  float* d_q = ToDevice(q);
  float* d_out = ToDevice(std::vector<float>(size_t{rows} * kHeads * kKv, NAN));
  float* d_dense = ToDevice(std::vector<float>(size_t{rows} * kHeads * kKv, NAN));
  int32_t* d_zero = ToDevice(std::vector<int32_t>(rows, 0));
  const cuda::PagedLatents gathered_rows{codec, kTpb, nullptr, 0, nullptr, 0, d_zero, d_gathered, d_counts, k};
  constexpr float kScale = 0.05f;
  status = cuda::PagedMlaDecode(shape, gathered_rows, rows, d_q, kScale, d_out, nullptr, nullptr);
  const std::vector<float> out = ToHost(d_out, size_t{rows} * kHeads * kKv);
  ok = ok && status.ok();
  double worst = 0, worst_dense = 0;
  for (uint32_t r = 0; ok && r < rows; ++r) {
    std::vector<float> q_latent(kHeads * kKv), q_rope(kHeads * kRope), cpu(kHeads * kKv);
    for (uint32_t h = 0; h < kHeads; ++h) {
      const float* qh = q.data() + (size_t{r} * kHeads + h) * kDim;
      std::copy_n(qh, kKv, q_latent.data() + h * kKv);
      std::copy_n(qh + kKv, kRope, q_rope.data() + h * kRope);
    }
    (void)AbsorbedMlaDecode(shape, q_latent, q_rope, kScale, {},
                            std::span(want).subspan(size_t{r} * k * kDim, size_t(counts[r]) * kDim), cpu);
    for (size_t i = 0; i < cpu.size(); ++i) {
      worst = std::max(worst, double(std::fabs(cpu[i] - out[size_t{r} * kHeads * kKv + i])));
    }
  }
  ok = ok && worst <= 1e-4;
  double worst_blocks = 0;
  const bool blocks_ok = ok && GatheredBlocksMatch(shape, latents, rows, d_selected, k, counts, d_counts, gathered, d_q,
                                                   kScale, out, worst_blocks);
  std::printf("%-5s %s: bf16 blocks %s (attention %.1e from the float rows')\n", CodecName(codec),
              all ? "every token chosen" : "some tokens chosen ", blocks_ok ? "hold them" : "MISMATCH", worst_blocks);
  ok = ok && blocks_ok;
  if (all && ok) {  // every token chosen: the dense attention's result
    cuda::PagedMlaOptions cores;
    cores.tensor_cores = false;
    status = cuda::PagedMlaDecode(shape, latents, rows, d_q, kScale, d_dense, nullptr, nullptr, cores);
    const std::vector<float> dense = ToHost(d_dense, out.size());
    for (size_t i = 0; i < out.size(); ++i) worst_dense = std::max(worst_dense, double(std::fabs(dense[i] - out[i])));
    ok = status.ok() && worst_dense <= 1e-4;
  }
  std::printf("%-5s %s: %s (attention's largest error %.1e against the CPU%s)\n", CodecName(codec),
              all ? "every token chosen" : "some tokens chosen ",
              ok ? "gathered bits equal, attention matches" : "MISMATCH", worst,
              all ? (", " + std::to_string(worst_dense) + " against dense").c_str() : "");
  if (!status.ok()) std::printf("  %s\n", status.message().c_str());
  // A token past its sequence: refused, naming the row.
  if (ok && !all) {
    std::vector<int32_t> bad = selected;
    bad[size_t{1} * k] = blocks[1] * kTpb + tails[1];  // row 1, one past its last token
    int32_t* d_bad = ToDevice(bad);
    cudaMemcpy(d_fault, &cuda::kNoPagedMlaFault, sizeof cuda::kNoPagedMlaFault, cudaMemcpyHostToDevice);
    status = cuda::GatherLatents(shape, latents, rows, d_bad, k, d_counts, d_gathered, d_fault, nullptr);
    const Status found = cuda::PagedMlaFault(ToHost(d_fault, 1)[0]);
    ok = status.ok() && found.code() == StatusCode::kInvalidArgument &&
         found.message().find("sequence 1 ") != std::string::npos;
    std::printf("      a chosen token past its sequence: %s\n", ok ? found.message().c_str() : "NOT REFUSED");
    cudaFree(d_bad);
  }
  for (void* p : std::initializer_list<void*>{d_pool, d_table, d_blocks, d_tails, d_selected, d_counts, d_tail,
                                              d_gathered, d_fault, d_q, d_out, d_dense, d_zero}) {
    cudaFree(p);
  }
  return ok;
}

// One layer's attention at V3.2's shapes: dense over every block against
// the sparse step, per batch, with the bytes each must move.
void Benchmark() {
  constexpr uint32_t kContext = 65536, kTopK = 2048, kIxHeads = 64, kIxDim = 128, kV32Heads = 128;
  constexpr uint32_t kBlocks = kContext / kTpb, kMaxBatch = 128;
  const double copy_gbs = cuda::DeviceCopyGBs(size_t{1} << 32);
  std::printf("\nV3.2 decode attention, one layer, %u-token contexts, top %u; copy %.0f GB/s (read + write)\n",
              kContext, kTopK, copy_gbs);
  std::printf("%-5s %5s %10s %10s %10s %10s %10s %11s %11s %7s\n", "codec", "batch", "dense ms", "score ms", "top-k ms",
              "gather ms", "attend ms", "sparse ms", "sparse MB", "x dense");
  std::mt19937_64 rng(5);
  const MlaShape shape{kV32Heads, kKv, kRope};
  // Keys and queries, shared by every codec's rows.
  std::vector<uint8_t> keys, q_codes;
  std::vector<float> key_scales, q_scales;
  RoundFp8(Random(size_t{kContext} * kIxDim, rng), kIxDim, keys, key_scales);
  RoundFp8(Random(size_t{kMaxBatch} * kIxHeads * kIxDim, rng), kIxDim, q_codes, q_scales);
  // Each sequence its own keys: the whole array repeated per sequence.
  uint8_t* d_keys = nullptr;
  float* d_key_scales = nullptr;
  cudaMalloc(&d_keys, size_t{kMaxBatch} * kContext * kIxDim);
  cudaMalloc(&d_key_scales, size_t{kMaxBatch} * kContext * 4);
  for (uint32_t b = 0; b < kMaxBatch; ++b) {
    cudaMemcpy(d_keys + size_t{b} * kContext * kIxDim, keys.data(), keys.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(d_key_scales + size_t{b} * kContext, key_scales.data(), key_scales.size() * 4, cudaMemcpyHostToDevice);
  }
  std::vector<int64_t> offsets(kMaxBatch);
  for (uint32_t b = 0; b < kMaxBatch; ++b) offsets[b] = int64_t{b} * kContext;
  int64_t* d_offsets = ToDevice(offsets);
  int32_t* d_visible = ToDevice(std::vector<int32_t>(kMaxBatch, kContext));
  uint8_t* d_q_codes = ToDevice(q_codes);
  float* d_weights = ToDevice(Random(size_t{kMaxBatch} * kIxHeads, rng));
  float* d_scores = nullptr;
  int32_t *d_selected = nullptr, *d_counts = nullptr;
  cudaMalloc(&d_scores, size_t{kMaxBatch} * kContext * 4);
  cudaMalloc(&d_selected, size_t{kMaxBatch} * kTopK * 4);
  cudaMalloc(&d_counts, size_t{kMaxBatch} * 4);
  // The chosen tokens as the runtime gathers them: bf16 blocks, float tails.
  constexpr uint32_t kGatheredBlocks = kTopK / cuda::kGatheredBlockTokens;
  cuda::GatheredLatents g;
  cudaMalloc(&g.pool, size_t{kMaxBatch} * kGatheredBlocks * cuda::GatheredBlockBytes(shape));
  cudaMalloc(&g.block_table, size_t{kMaxBatch} * kGatheredBlocks * 4);
  cudaMalloc(&g.blocks, size_t{kMaxBatch} * 4);
  cudaMalloc(&g.tail, size_t{kMaxBatch} * cuda::kGatheredBlockTokens * kDim * 4);
  cudaMalloc(&g.tail_tokens, size_t{kMaxBatch} * 4);
  float* d_q = ToDevice(Random(size_t{kMaxBatch} * kV32Heads * kDim, rng));
  float* d_out = nullptr;
  cudaMalloc(&d_out, size_t{kMaxBatch} * kV32Heads * kKv * 4);
  unsigned long long* d_fault = ToDevice(std::vector<unsigned long long>{cuda::kNoPagedMlaFault});
  for (Codec codec : {Codec::kBf16, Codec::kFp8, Codec::kInt8}) {
    const size_t block_bytes = EncodedBytes(codec, kShape);
    const uint32_t pool_blocks = kMaxBatch * kBlocks;
    uint8_t* d_pool = nullptr;
    if (cudaMalloc(&d_pool, size_t{pool_blocks} * block_bytes) != cudaSuccess) {
      std::printf("%-5s no room for %u blocks\n", CodecName(codec), pool_blocks);
      continue;
    }
    std::vector<uint8_t> base(64 * block_bytes);
    for (int i = 0; i < 64; ++i) {
      (void)Quantize(codec, kShape, Random(kShape.values(), rng),
                     std::span(base).subspan(i * block_bytes, block_bytes));
    }
    cudaMemcpy(d_pool, base.data(), base.size(), cudaMemcpyHostToDevice);
    for (size_t have = 64; have < pool_blocks; have *= 2) {
      const size_t n = std::min<size_t>(have, pool_blocks - have);
      cudaMemcpy(d_pool + have * block_bytes, d_pool, n * block_bytes, cudaMemcpyDeviceToDevice);
    }
    for (uint32_t batch : {1u, 8u, 32u, 128u}) {
      std::vector<int32_t> table(size_t{batch} * kBlocks);
      std::iota(table.begin(), table.end(), 0);
      int32_t* d_table = ToDevice(table);
      int32_t* d_nblocks = ToDevice(std::vector<int32_t>(batch, kBlocks));
      const cuda::PagedLatents latents{codec,   kTpb,      d_pool,  pool_blocks, d_table,
                                       kBlocks, d_nblocks, nullptr, nullptr,     0};
      const cuda::PagedLatents gathered = cuda::GatheredPagedLatents(g, batch, kTopK);
      const cuda::IndexerKeys ik{d_keys, d_key_scales, d_offsets, d_visible, kContext};
      constexpr int kReps = 10;
      const double dense = check::Milliseconds(
          [&] { (void)cuda::PagedMlaDecode(shape, latents, batch, d_q, 0.04f, d_out, nullptr, nullptr); }, kReps);
      const double score = check::Milliseconds(
          [&] { (void)cuda::IndexerScores(kIxHeads, kIxDim, batch, d_q_codes, d_weights, ik, d_scores, nullptr); },
          kReps);
      const double select = check::Milliseconds(
          [&] {
            (void)cuda::SelectTopTokens(batch, d_scores, kContext, d_visible, kTopK, d_selected, d_counts, nullptr);
          },
          kReps);
      const double gather = check::Milliseconds(
          [&] {
            (void)cuda::GatherLatentBlocks(shape, latents, batch, d_selected, kTopK, d_counts, g, d_fault, nullptr);
          },
          kReps);
      const double attend = check::Milliseconds(
          [&] { (void)cuda::PagedMlaDecode(shape, gathered, batch, d_q, 0.04f, d_out, nullptr, nullptr); }, kReps);
      const double sparse = score + select + gather + attend;
      // Bytes a sparse step must move: every key and scale, the scores
      // written and read back, the chosen tokens' stored bytes, their bf16
      // rows written and read.
      const double token_bytes = double(block_bytes) / kTpb;
      const double sparse_mb =
          batch * (double(kContext) * (kIxDim + 4 + 4 * 2) + kTopK * (token_bytes + 2.0 * 2 * kDim)) / 1e6;
      std::printf("%-5s %5u %10.3f %10.3f %10.3f %10.3f %10.3f %11.3f %11.1f %6.2fx\n", CodecName(codec), batch, dense,
                  score, select, gather, attend, sparse, sparse_mb, dense / sparse);
      cudaFree(d_table), cudaFree(d_nblocks);
    }
    std::printf("%-5s dense reads %.1f MB a sequence\n", CodecName(codec), double(kBlocks) * block_bytes / 1e6);
    cudaFree(d_pool);
  }
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    std::printf("benchmark: %s\n", cudaGetErrorString(e));
  }
  for (void* p : std::initializer_list<void*>{d_keys, d_key_scales, d_offsets, d_visible, d_q_codes, d_weights,
                                              d_scores, d_selected, d_counts, g.pool, g.block_table, g.blocks, g.tail,
                                              g.tail_tokens, d_q, d_out, d_fault}) {
    cudaFree(p);
  }
}

int Main(bool benchmark) {
  if (!check::DeviceOrSkip("the sparse MLA check was")) return 77;
  bool ok = CheckScores(4, 16, 1);
  ok = CheckScores(64, 128, 2) && ok;
  ok = CheckSelectionTies() && ok;
  for (Codec codec : kAllCodecs) {
    ok = CheckGather(codec, false, 20 + static_cast<int>(codec)) && ok;
    ok = CheckGather(codec, true, 30 + static_cast<int>(codec)) && ok;
  }
  std::printf(ok ? "PASS\n" : "FAIL\n");
  if (benchmark) Benchmark();
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::kernels

int main(int argc, char** argv) { return kvtier::kernels::Main(kvtier::kernels::check::WantBenchmark(argc, argv)); }
