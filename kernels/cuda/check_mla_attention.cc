// GPU paged MLA decode attention check and benchmark, for the device
// machine (no gtest there). Correctness: batches of sequences of different
// lengths (blocks through a shuffled block table, plus float tails), every
// codec, 16, 20 and 128 heads, on fresh random latents with an outlier
// channel and outputs poisoned with NaN first; the GPU's out and lse against
// a float64 reference over the same dequantized latents and out against the
// CPU's AbsorbedMlaDecode. Each output channel is a weighted sum
// sum_t p_t c_t, so its error is bounded relative to sum_t p_t |c_t| (the
// outlier channel's can be 20x its result): on CUDA cores (float32)
// 1e-4 against float64, lse within 1e-4; on tensor cores (fp16 latents,
// queries and weights) 6e-3, lse 1e-3; against the CPU, those plus the
// CPU's own bound (5e-3 for int8, whose queries are rounded to int16,
// 5e-4 otherwise). Each line prints the largest errors seen. A block index outside the
// pool must come back INVALID_ARGUMENT; rows sharing blocks and a tail must
// match copies, and so must a call in a workspace of the caller's (one a
// byte short refused). Then a table: latent bytes read per second at 16 heads,
// contexts 4k-64k, batch 1-128, each codec on tensor cores (and int8 on
// CUDA cores), against a device-to-device cudaMemcpy measured in the same
// run, and a call's fixed cost with its scratch from the stream's pool and
// in the caller's workspace.
// Exit codes: 0 pass, 1 mismatch or CUDA error, 77 no device (ctest: skip).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "check_util.h"
#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/cuda_codec.h"
#include "kvtier/kernels/cuda_mla_attention.h"
#include "kvtier/kernels/mla_attention.h"

namespace kvtier::kernels {
namespace {

constexpr uint32_t kKv = 512, kRope = 64, kDim = kKv + kRope, kTpb = 64;
constexpr BlockShape kBlockShape{kTpb, kKv, kRope};

// Device buffer freed at scope end.
template <typename T>
struct DeviceArray {
  T* data = nullptr;
  explicit DeviceArray(size_t n) {
    if (cudaMalloc(&data, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) data = nullptr;
  }
  DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    if (data != nullptr) cudaMemcpy(data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceArray() { cudaFree(data); }
  std::vector<T> Read(size_t n) const {
    std::vector<T> out(n);
    cudaMemcpy(out.data(), data, n * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }
};

std::vector<float> Random(size_t n, std::mt19937_64& rng, float outlier_every = 0) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = normal(rng) * (outlier_every > 0 && i % kDim == 7 ? 20.0f : 1.0f);
  return x;
}

struct Sequence {
  uint32_t blocks;
  uint32_t tail;
};

// Error bounds, relative to sum_t p_t |c_t| of each output channel (lse:
// to max(1, |lse|)), and the largest errors seen.
struct Tolerance {
  double out = 1e-4, lse = 1e-4;
};
struct Errors {
  double out = 0, cpu = 0, lse = 0;
};
// The CPU's own error, added to the GPU's when they are compared: its int8
// path rounds the query (times the block's scales) to int16 per block, and
// an outlier channel takes most of that range (3.1e-3 seen on an H200).
double CpuBound(Codec codec) { return codec == Codec::kInt8 ? 5e-3 : 5e-4; }

// One batch checked on one codec and head count; false (and why) on a
// mismatch.
bool CheckBatch(Codec codec, uint32_t heads, const std::vector<Sequence>& seqs, uint64_t seed,
                const cuda::PagedMlaOptions& options, const Tolerance& tol, Errors* worst) {
  std::mt19937_64 rng(seed);
  const uint32_t batch = static_cast<uint32_t>(seqs.size());
  uint32_t max_blocks = 0, max_tail = 0, pool_blocks = 0;
  for (const Sequence& s : seqs) {
    max_blocks = std::max(max_blocks, s.blocks), max_tail = std::max(max_tail, s.tail);
    pool_blocks += s.blocks;
  }
  const size_t block_bytes = EncodedBytes(codec, kBlockShape);
  // The pool in shuffled order: sequence b's j-th block sits at table[b][j].
  std::vector<int32_t> order(pool_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<uint8_t> pool(size_t{pool_blocks} * block_bytes);
  std::vector<int32_t> table(size_t{batch} * std::max(max_blocks, 1u), -1), counts(batch), tails(batch);
  std::vector<float> tail(size_t{batch} * std::max(max_tail, 1u) * kDim, 0.0f);
  // Per sequence, as the CPU and the float64 reference read them.
  std::vector<std::vector<float>> dequantized(batch);
  std::vector<std::vector<LatentBlock>> cpu_blocks(batch);
  size_t next = 0;
  for (uint32_t b = 0; b < batch; ++b) {
    counts[b] = static_cast<int32_t>(seqs[b].blocks), tails[b] = static_cast<int32_t>(seqs[b].tail);
    for (uint32_t j = 0; j < seqs[b].blocks; ++j) {
      const int32_t slot = order[next++];
      table[size_t{b} * max_blocks + j] = slot;
      const std::vector<float> x = Random(kBlockShape.values(), rng, 1);
      const std::span<uint8_t> encoded(pool.data() + size_t(slot) * block_bytes, block_bytes);
      std::vector<float> back(x.size());
      if (!Quantize(codec, kBlockShape, x, encoded).ok() || !Dequantize(codec, kBlockShape, encoded, back).ok()) {
        std::fprintf(stderr, "CPU codec failed\n");
        return false;
      }
      dequantized[b].insert(dequantized[b].end(), back.begin(), back.end());
      cpu_blocks[b].push_back({codec, kTpb, encoded});
    }
    const std::vector<float> t = Random(size_t{seqs[b].tail} * kDim, rng);
    std::copy(t.begin(), t.end(), tail.begin() + size_t{b} * std::max(max_tail, 1u) * kDim);
    dequantized[b].insert(dequantized[b].end(), t.begin(), t.end());
  }
  const std::vector<float> q = Random(size_t{batch} * heads * kDim, rng);
  const float scale = 1.0f / std::sqrt(192.0f);

  DeviceArray<uint8_t> d_pool(pool);
  DeviceArray<int32_t> d_table(table), d_counts(counts), d_tails(tails);
  DeviceArray<float> d_tail(tail), d_q(q), d_out(size_t{batch} * heads * kKv), d_lse(size_t{batch} * heads);
  cudaMemset(d_out.data, 0xff, size_t{batch} * heads * kKv * 4);  // NaN: every element must be written
  cudaMemset(d_lse.data, 0xff, size_t{batch} * heads * 4);
  cuda::PagedLatents latents{codec,
                             kTpb,
                             d_pool.data,
                             pool_blocks,
                             d_table.data,
                             max_blocks,
                             d_counts.data,
                             max_tail > 0 ? d_tail.data : nullptr,
                             max_tail > 0 ? d_tails.data : nullptr,
                             max_tail};
  const MlaShape shape{heads, kKv, kRope};
  const Status status =
      cuda::PagedMlaDecode(shape, latents, batch, d_q.data, scale, d_out.data, d_lse.data, nullptr, options);
  if (!status.ok()) {
    std::fprintf(stderr, "PagedMlaDecode: %s\n", status.message().c_str());
    return false;
  }
  const std::vector<float> out = d_out.Read(size_t{batch} * heads * kKv), lse = d_lse.Read(size_t{batch} * heads);

  for (uint32_t b = 0; b < batch; ++b) {
    const size_t tokens = dequantized[b].size() / kDim;
    std::vector<float> q_latent(size_t{heads} * kKv), q_rope(size_t{heads} * kRope), cpu_out(size_t{heads} * kKv);
    for (uint32_t h = 0; h < heads; ++h) {
      const float* qh = q.data() + (size_t{b} * heads + h) * kDim;
      std::copy_n(qh, kKv, q_latent.data() + size_t{h} * kKv);
      std::copy_n(qh + kKv, kRope, q_rope.data() + size_t{h} * kRope);
    }
    const std::span<const float> cpu_tail(tail.data() + size_t{b} * std::max(max_tail, 1u) * kDim,
                                          size_t{seqs[b].tail} * kDim);
    if (!AbsorbedMlaDecode(shape, q_latent, q_rope, scale, cpu_blocks[b], cpu_tail, cpu_out).ok()) {
      std::fprintf(stderr, "CPU attention failed\n");
      return false;
    }
    for (uint32_t h = 0; h < heads; ++h) {
      // float64 reference over the dequantized latents.
      const float* qh = q.data() + (size_t{b} * heads + h) * kDim;
      std::vector<double> score(tokens);
      double m = -INFINITY;
      for (size_t t = 0; t < tokens; ++t) {
        double dot = 0;
        for (uint32_t c = 0; c < kDim; ++c) dot += double{qh[c]} * dequantized[b][t * kDim + c];
        score[t] = dot * scale;
        m = std::max(m, score[t]);
      }
      double sum = 0;
      for (double& s : score) sum += (s = std::exp(s - m));
      // want[c] = sum_t p_t c_t; magnitude[c] = sum_t p_t |c_t|, its scale.
      std::vector<double> want(kKv, 0.0), magnitude(kKv, 0.0);
      for (size_t t = 0; t < tokens; ++t) {
        for (uint32_t c = 0; c < kKv; ++c) {
          const double v = dequantized[b][t * kDim + c];
          want[c] += score[t] / sum * v, magnitude[c] += score[t] / sum * std::abs(v);
        }
      }
      const float* got = out.data() + (size_t{b} * heads + h) * kKv;
      const float* cpu = cpu_out.data() + size_t{h} * kKv;
      for (uint32_t c = 0; c < kKv; ++c) {
        const double err = std::abs(got[c] - want[c]) / magnitude[c];
        const double cpu_err = std::abs(got[c] - cpu[c]) / magnitude[c];
        worst->out = std::max(worst->out, err), worst->cpu = std::max(worst->cpu, cpu_err);
        if (!(err <= tol.out) || !(cpu_err <= tol.out + CpuBound(codec))) {
          std::fprintf(stderr,
                       "%s, %u heads: sequence %u head %u channel %u: GPU %g, float64 %g, CPU %g, sum p|c| %g\n",
                       CodecName(codec), heads, b, h, c, got[c], want[c], cpu[c], magnitude[c]);
          return false;
        }
      }
      const double want_lse = m + std::log(sum);
      const double lse_err = std::abs(lse[size_t{b} * heads + h] - want_lse) / std::max(1.0, std::abs(want_lse));
      worst->lse = std::max(worst->lse, lse_err);
      if (!(lse_err <= tol.lse)) {
        std::fprintf(stderr, "%s: sequence %u head %u: lse %g, float64 %g\n", CodecName(codec), b, h,
                     lse[size_t{b} * heads + h], want_lse);
        return false;
      }
    }
  }
  return true;
}

// A block index outside the pool is refused, naming the sequence.
bool RefusesBadBlockIndex() {
  const size_t block_bytes = EncodedBytes(Codec::kInt8, kBlockShape);
  DeviceArray<uint8_t> pool(2 * block_bytes);
  cudaMemset(pool.data, 0, 2 * block_bytes);
  DeviceArray<int32_t> table(std::vector<int32_t>{0, 1, 0, 5}), counts(std::vector<int32_t>{2, 2});
  DeviceArray<float> q(std::vector<float>(2 * 16 * kDim, 0.5f)), out(2 * 16 * kKv);
  cuda::PagedLatents latents{Codec::kInt8, kTpb, pool.data, 2, table.data, 2, counts.data, nullptr, nullptr, 0};
  const Status s = cuda::PagedMlaDecode({16, kKv, kRope}, latents, 2, q.data, 0.1f, out.data, nullptr, nullptr);
  const bool ok = s.code() == StatusCode::kInvalidArgument && s.message().find("sequence 1") != std::string::npos;
  if (!ok) std::fprintf(stderr, "bad block index: got '%s'\n", s.message().c_str());
  return ok;
}

// A call's fixed cost as the decode worker makes it (a fault word of the
// caller's, not waited for): host microseconds until `call` returns, and
// microseconds a call when calls run back to back on the stream.
struct CallCost {
  double host_us, stream_us;
};
template <typename Call>
CallCost UnwaitedCallCost(Call call) {
  constexpr int kCalls = 200;
  (void)call();
  cudaDeviceSynchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) (void)call();
  const auto issued = std::chrono::steady_clock::now();
  cudaDeviceSynchronize();
  const auto done = std::chrono::steady_clock::now();
  const auto us = [](auto d) { return std::chrono::duration<double, std::micro>(d).count() / kCalls; };
  return {us(issued - start), us(done - start)};
}

void Benchmark() {
  constexpr uint32_t kHeads = 16, kMaxBatch = 128, kMaxContext = 65536;
  const uint32_t max_blocks = kMaxContext / kTpb;
  const double copy_gbs = cuda::DeviceCopyGBs(size_t{1} << 32);
  std::printf("\ndevice-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);
  std::printf("%-9s %8s %6s %10s %10s %8s\n", "codec", "context", "batch", "ms", "GB/s", "% copy");
  std::mt19937_64 rng(3);
  struct Variant {
    Codec codec;
    bool tensor_cores;
  };
  struct FixedCost {
    std::string name;
    double waited_us;
    CallCost cost, in_workspace;  // scratch from the stream's pool, or the caller's
  };
  std::vector<FixedCost> fixed;
  for (const Variant v : {Variant{Codec::kBf16, true}, Variant{Codec::kFp8, true}, Variant{Codec::kInt8, true},
                          Variant{Codec::kInt4, true}, Variant{Codec::kInt8, false}}) {
    const Codec codec = v.codec;
    cuda::PagedMlaOptions options;
    options.tensor_cores = v.tensor_cores;
    const std::string name = std::string(CodecName(codec)) + (v.tensor_cores ? "" : " cores");
    const size_t block_bytes = EncodedBytes(codec, kBlockShape);
    const uint32_t pool_blocks = kMaxBatch * max_blocks;
    DeviceArray<uint8_t> pool(size_t{pool_blocks} * block_bytes);
    // 64 distinct blocks, copied over the pool by doubling.
    std::vector<uint8_t> base(64 * block_bytes);
    for (int i = 0; i < 64; ++i) {
      const std::vector<float> x = Random(kBlockShape.values(), rng, 1);
      (void)Quantize(codec, kBlockShape, x, std::span(base.data() + i * block_bytes, block_bytes));
    }
    cudaMemcpy(pool.data, base.data(), base.size(), cudaMemcpyHostToDevice);
    for (size_t have = 64; have < pool_blocks; have *= 2) {
      const size_t n = std::min<size_t>(have, pool_blocks - have);
      cudaMemcpy(pool.data + have * block_bytes, pool.data, n * block_bytes, cudaMemcpyDeviceToDevice);
    }
    DeviceArray<float> q(Random(size_t{kMaxBatch} * kHeads * kDim, rng)), out(size_t{kMaxBatch} * kHeads * kKv);
    for (uint32_t context : {4096u, 16384u, 65536u}) {
      for (uint32_t batch : {1u, 8u, 32u, 128u}) {
        const uint32_t blocks = context / kTpb;
        std::vector<int32_t> table(size_t{batch} * blocks), counts(batch, static_cast<int32_t>(blocks));
        for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i % pool_blocks);
        DeviceArray<int32_t> d_table(table), d_counts(counts);
        cuda::PagedLatents latents{codec,  kTpb,          pool.data, pool_blocks, d_table.data,
                                   blocks, d_counts.data, nullptr,   nullptr,     0};
        Status status;
        const double ms = check::Milliseconds(
            [&] {
              status = cuda::PagedMlaDecode({kHeads, kKv, kRope}, latents, batch, q.data, 0.07f, out.data, nullptr,
                                            nullptr, options);
            },
            10);
        if (!status.ok()) {
          std::printf("%-9s %8u %6u  error: %s\n", name.c_str(), context, batch, status.message().c_str());
          continue;
        }
        const double gbs = double(batch) * blocks * block_bytes / ms / 1e6;
        std::printf("%-9s %8u %6u %10.3f %10.0f %7.0f%%\n", name.c_str(), context, batch, ms, gbs,
                    100 * gbs / copy_gbs);
        if (context == 4096 && batch == 1) {
          cuda::PagedMlaOptions unwaited = options;
          DeviceArray<unsigned long long> fault(std::vector<unsigned long long>{cuda::kNoPagedMlaFault});
          unwaited.fault = fault.data;
          const CallCost cost = UnwaitedCallCost([&] {
            return cuda::PagedMlaDecode({kHeads, kKv, kRope}, latents, batch, q.data, 0.07f, out.data, nullptr, nullptr,
                                        unwaited);
          });
          unwaited.workspace_bytes = cuda::PagedMlaWorkspaceBytes({kHeads, kKv, kRope}, latents, batch, unwaited);
          DeviceArray<uint8_t> workspace(std::max<size_t>(unwaited.workspace_bytes, 1));
          unwaited.workspace = workspace.data;
          const CallCost in_workspace = UnwaitedCallCost([&] {
            return cuda::PagedMlaDecode({kHeads, kKv, kRope}, latents, batch, q.data, 0.07f, out.data, nullptr, nullptr,
                                        unwaited);
          });
          fixed.push_back({name, 1000 * ms, cost, in_workspace});
        }
      }
    }
  }
  std::printf(
      "\na call's fixed cost, 4k tokens x 1 sequence (us): waited (the rows above), and with a fault word "
      "of the caller's (not waited): host time a call and a call back to back, its scratch taken from the "
      "stream's pool, then in a workspace of the caller's (as the decode worker calls it)\n");
  std::printf("%-9s %10s %10s %12s %16s %20s\n", "codec", "waited", "host", "back to back", "host, workspace",
              "back to back, wksp");
  for (const FixedCost& f : fixed) {
    std::printf("%-9s %10.1f %10.1f %12.1f %16.1f %20.1f\n", f.name.c_str(), f.waited_us, f.cost.host_us,
                f.cost.stream_us, f.in_workspace.host_us, f.in_workspace.stream_us);
  }
}

// Rows that share one sequence's block-table row and tail (block_table_rows,
// tail_offsets: as a prefill's rows do) give bit for bit what they give with
// copies of both, int8 blocks on tensor cores; an entry past the table or
// the tail is refused, naming the row. The same with a caller's fault word
// (PagedMlaDecode does not wait): the same bits, and the same refusals
// once the word is read back.
bool SharedRowsMatchCopies() {
  std::mt19937_64 rng(7);
  constexpr uint32_t heads = 16, rows = 3, kTail = 40;
  const uint32_t visible[rows] = {1, 9, kTail};
  const size_t block_bytes = EncodedBytes(Codec::kInt8, kBlockShape);
  std::vector<uint8_t> pool(2 * block_bytes);
  for (int j = 0; j < 2; ++j) {
    if (!Quantize(Codec::kInt8, kBlockShape, Random(kBlockShape.values(), rng),
                  std::span(pool).subspan(j * block_bytes, block_bytes))
             .ok()) {
      return false;
    }
  }
  const std::vector<float> tail = Random(size_t{kTail} * kDim, rng), q = Random(size_t{rows} * heads * kDim, rng);
  std::vector<float> copies(size_t{rows} * kTail * kDim, 0.0f);
  for (uint32_t r = 0; r < rows; ++r) {
    std::copy_n(tail.begin(), size_t{visible[r]} * kDim, copies.begin() + size_t{r} * kTail * kDim);
  }
  DeviceArray<uint8_t> d_pool(pool);
  DeviceArray<float> d_tail(tail), d_copies(copies), d_q(q), out_shared(size_t{rows} * heads * kKv),
      out_copies(size_t{rows} * heads * kKv);
  DeviceArray<int32_t> tables(std::vector<int32_t>{0, 1, 0, 1, 0, 1}), counts(std::vector<int32_t>(rows, 2)),
      tokens(std::vector<int32_t>(visible, visible + rows)), shared_rows(std::vector<int32_t>(rows, 0)),
      bad_rows(std::vector<int32_t>{0, 0, 1});
  DeviceArray<int64_t> offsets(std::vector<int64_t>(rows, 0)), bad_offsets(std::vector<int64_t>{0, 0, 1});
  const MlaShape shape{heads, kKv, kRope};
  cuda::PagedLatents latents{Codec::kInt8, kTpb,          d_pool.data, 2,    tables.data, 2,
                             counts.data,  d_copies.data, tokens.data, kTail};
  bool ok = cuda::PagedMlaDecode(shape, latents, rows, d_q.data, 0.1f, out_copies.data, nullptr, nullptr).ok();
  latents.block_table_rows = shared_rows.data, latents.block_table_height = 1;
  latents.tail = d_tail.data, latents.tail_offsets = offsets.data, latents.tail_capacity = kTail;
  ok = ok && cuda::PagedMlaDecode(shape, latents, rows, d_q.data, 0.1f, out_shared.data, nullptr, nullptr).ok();
  ok = ok && out_shared.Read(size_t{rows} * heads * kKv) == out_copies.Read(size_t{rows} * heads * kKv);
  DeviceArray<unsigned long long> fault(std::vector<unsigned long long>{cuda::kNoPagedMlaFault});
  cuda::PagedMlaOptions unwaited;
  unwaited.fault = fault.data;
  DeviceArray<float> out_unwaited(size_t{rows} * heads * kKv);
  ok = ok &&
       cuda::PagedMlaDecode(shape, latents, rows, d_q.data, 0.1f, out_unwaited.data, nullptr, nullptr, unwaited).ok();
  // Read(): cudaMemcpy on the default stream, which waits for the kernels.
  ok = ok && out_unwaited.Read(size_t{rows} * heads * kKv) == out_copies.Read(size_t{rows} * heads * kKv);
  ok = ok && fault.Read(1)[0] == cuda::kNoPagedMlaFault;
  if (!ok) std::printf("FAIL shared rows, or the same with a fault word (not waited for)\n");
  // And in a workspace of the caller's, as the decode worker calls it: the
  // same bits; a workspace a byte short is refused.
  cuda::PagedMlaOptions in_workspace = unwaited;
  in_workspace.workspace_bytes = cuda::PagedMlaWorkspaceBytes(shape, latents, rows, in_workspace);
  DeviceArray<uint8_t> workspace(std::max<size_t>(in_workspace.workspace_bytes, 1));
  in_workspace.workspace = workspace.data;
  DeviceArray<float> out_workspace(size_t{rows} * heads * kKv);
  bool workspace_ok =
      in_workspace.workspace_bytes > 0 &&
      cuda::PagedMlaDecode(shape, latents, rows, d_q.data, 0.1f, out_workspace.data, nullptr, nullptr, in_workspace)
          .ok() &&
      out_workspace.Read(size_t{rows} * heads * kKv) == out_copies.Read(size_t{rows} * heads * kKv);
  --in_workspace.workspace_bytes;
  const Status too_small =
      cuda::PagedMlaDecode(shape, latents, rows, d_q.data, 0.1f, out_workspace.data, nullptr, nullptr, in_workspace);
  workspace_ok = workspace_ok && too_small.code() == StatusCode::kInvalidArgument &&
                 too_small.message().find("workspace") != std::string::npos;
  if (!workspace_ok) std::printf("FAIL a caller's workspace: other bits, or one too small not refused\n");
  ok = ok && workspace_ok;
  auto refused = [&](const cuda::PagedLatents& bad) {
    const Status s = cuda::PagedMlaDecode(shape, bad, rows, d_q.data, 0.1f, out_shared.data, nullptr, nullptr);
    cudaMemcpy(fault.data, &cuda::kNoPagedMlaFault, sizeof cuda::kNoPagedMlaFault, cudaMemcpyHostToDevice);
    const bool queued =
        cuda::PagedMlaDecode(shape, bad, rows, d_q.data, 0.1f, out_shared.data, nullptr, nullptr, unwaited).ok();
    const Status found = cuda::PagedMlaFault(fault.Read(1)[0]);
    const bool refusals = s.code() == StatusCode::kInvalidArgument &&
                          s.message().find("sequence 2") != std::string::npos && queued && found.code() == s.code() &&
                          found.message() == s.message();
    if (!refusals) {
      std::printf("FAIL refusal: waited '%s', fault word '%s'\n", s.message().c_str(), found.message().c_str());
    }
    return refusals;
  };
  cuda::PagedLatents bad = latents;
  bad.tail_offsets = bad_offsets.data;
  ok = ok && refused(bad);
  bad = latents;
  bad.block_table_rows = bad_rows.data;
  return ok && refused(bad);
}

// --profile CODEC CONTEXT BATCH: that one benchmark case, run three times
// (for a profiler: ncu --launch-skip 1 --launch-count 1).
int Profile(const char* codec_name, uint32_t context, uint32_t batch) {
  const Codec* codec_it = std::find_if(std::begin(kAllCodecs), std::end(kAllCodecs),
                                       [&](Codec c) { return std::string(CodecName(c)) == codec_name; });
  if (codec_it == std::end(kAllCodecs) || context < kTpb || batch == 0) {
    std::fprintf(stderr,
                 "--profile CODEC CONTEXT BATCH: a codec (bf16, fp8, int8, int4), at least %u tokens, "
                 "at least 1 sequence\n",
                 kTpb);
    return 2;
  }
  const Codec codec = *codec_it;
  if (!check::DeviceOrSkip("the CUDA attention was")) return 77;
  constexpr uint32_t kHeads = 16;
  const uint32_t blocks = context / kTpb;
  const size_t block_bytes = EncodedBytes(codec, kBlockShape);
  std::mt19937_64 rng(5);
  std::vector<uint8_t> base(block_bytes);
  (void)Quantize(codec, kBlockShape, Random(kBlockShape.values(), rng, 1), base);
  DeviceArray<uint8_t> pool(size_t{batch} * blocks * block_bytes);
  for (size_t i = 0; i < size_t{batch} * blocks; ++i) {
    cudaMemcpy(pool.data + i * block_bytes, base.data(), block_bytes, cudaMemcpyHostToDevice);
  }
  std::vector<int32_t> table(size_t{batch} * blocks);
  std::iota(table.begin(), table.end(), 0);
  DeviceArray<int32_t> d_table(table), d_counts(std::vector<int32_t>(batch, static_cast<int32_t>(blocks)));
  DeviceArray<float> q(Random(size_t{batch} * kHeads * kDim, rng)), out(size_t{batch} * kHeads * kKv);
  cuda::PagedLatents latents{codec,  kTpb,          pool.data, batch * blocks, d_table.data,
                             blocks, d_counts.data, nullptr,   nullptr,        0};
  for (int i = 0; i < 3; ++i) {
    const Status s =
        cuda::PagedMlaDecode({kHeads, kKv, kRope}, latents, batch, q.data, 0.07f, out.data, nullptr, nullptr);
    if (!s.ok()) return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
  }
  std::printf("profiled %s, %u tokens, batch %u\n", CodecName(codec), context, batch);
  return 0;
}

int Main(bool benchmark) {
  if (!check::DeviceOrSkip("the CUDA attention was")) return 77;
  bool ok = RefusesBadBlockIndex();
  std::printf("block index outside the pool: %s\n", ok ? "INVALID_ARGUMENT" : "NOT REFUSED");
  const bool shared = SharedRowsMatchCopies();
  std::printf("rows sharing blocks and a tail: %s\n", shared ? "same as copies; bad rows refused" : "WRONG");
  ok = ok && shared;
  // Tail only, one block, blocks and a tail, and a long sequence (split).
  const std::vector<Sequence> seqs = {{0, 5}, {1, 0}, {3, 17}, {40, 63}};
  for (Codec codec : kAllCodecs) {
    for (uint32_t heads : {16u, 20u, 128u}) {
      for (const bool tensor_cores : {false, true}) {
        cuda::PagedMlaOptions options;
        options.tensor_cores = tensor_cores;
        // fp16 latents, queries and weights (unit roundoff u = 4.9e-4): a
        // score's error is about u * |q| |k| * scale, 1e-3 here where the
        // outlier channel makes |k| large, and a weighted sum's error a few
        // of those (4.0e-3 seen on an H200 over 262,144 channels): 12 u.
        const Tolerance tol = tensor_cores ? Tolerance{6e-3, 1e-3} : Tolerance();
        Errors worst;
        const bool same = CheckBatch(codec, heads, seqs, (tensor_cores ? 200 : 100) + heads, options, tol, &worst);
        std::printf("%-5s %3u heads, %-13s %s (largest errors: %.1e, %.1e against the CPU, lse %.1e)\n",
                    CodecName(codec), heads,
                    tensor_cores ? "tensor cores:" : "CUDA cores:", same ? "matches float64 and the CPU" : "MISMATCH",
                    worst.out, worst.cpu, worst.lse);
        ok = ok && same;
      }
    }
  }
  if (benchmark) Benchmark();
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::kernels

// --profile runs one benchmark case; --no-benchmark the checks alone.
int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--profile") {
    return kvtier::kernels::Profile(argv[2], static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10)),
                                    static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 10)));
  }
  return kvtier::kernels::Main(kvtier::kernels::check::WantBenchmark(argc, argv));
}
