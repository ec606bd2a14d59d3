// What the paged MLA attention kernels share (mla_attention.cu runs them):
// the launch parameters and the layout of the per-split partial results
// that CombineKernel merges. For the .cu files of this directory.
#ifndef KVTIER_KERNELS_CUDA_MLA_ATTENTION_INTERNAL_H_
#define KVTIER_KERNELS_CUDA_MLA_ATTENTION_INTERNAL_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kvtier/kernels/cuda_mla_attention.h"
#include "kvtier/kernels/float_formats.h"

namespace kvtier::kernels::cuda::internal {

// What the device found wrong, reduced with atomicMin so the host sees the
// first sequence: (sequence << 2) | reason.
enum BadInput : uint32_t { kBadBlockCount = 1, kBadBlockIndex = 2, kBadTail = 3 };

// Notes that `sequence` has `reason` (any thread may call it).
__device__ inline void NoteBadInput(unsigned long long* bad, uint32_t sequence, BadInput reason) {
  atomicMin(bad, (static_cast<unsigned long long>(sequence) << 2) | reason);
}

// Channel c of token t of a stored block, as a float: the CPU codecs'
// decoded value, each product and sum rounded alone (no FMA) whatever the
// file's contraction flag.
__device__ inline float StoredValue(Codec codec, const uint8_t* block, uint32_t t, uint32_t c, uint32_t kv,
                                    uint32_t dim, uint32_t rope) {
  const auto bf16 = [](const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return Bf16ToFloat(h);
  };
  switch (codec) {
    case Codec::kBf16:
      return bf16(block + 2 * (size_t{t} * dim + c));
    case Codec::kInt8: {
      const int8_t code = static_cast<int8_t>(block[2 * size_t{dim} + size_t{t} * dim + c]);
      return __fmul_rn(static_cast<float>(code), bf16(block + 2 * size_t{c}));
    }
    case Codec::kInt4: {
      const uint32_t half = (dim + 1) / 2;
      const uint8_t byte = block[4 * size_t{dim} + size_t{t} * half + (c < half ? c : c - half)];
      const float code = static_cast<float>(c < half ? (byte & 0xf) : (byte >> 4));
      return __fadd_rn(bf16(block + 2 * (size_t{dim} + c)), __fmul_rn(code, bf16(block + 2 * size_t{c})));
    }
    case Codec::kFp8: {
      const uint32_t tiles = (kv + kFp8TileSize - 1) / kFp8TileSize;
      const uint8_t* token = block + size_t{t} * (kv + 4 * tiles + 2 * rope);
      if (c >= kv) return bf16(token + kv + 4 * tiles + 2 * (c - kv));
      float scale;
      memcpy(&scale, token + kv + 4 * (c / kFp8TileSize), 4);
      return __fmul_rn(Fp8E4m3ToFloat(token[c]), scale);
    }
  }
  return 0.0f;
}

// The block-table row sequence b reads (block_table_rows[b], or b itself);
// -1 when that lies outside the table.
__device__ inline int64_t TableRow(const PagedLatents& L, uint32_t b) {
  if (L.block_table_rows == nullptr) return b;
  const int32_t row = L.block_table_rows[b];
  return row >= 0 && static_cast<uint32_t>(row) < L.block_table_height ? row : -1;
}

struct Params {
  MlaShape shape;
  PagedLatents latents;
  size_t block_bytes;
  const float* q;
  float scale;
  uint32_t splits;            // in the partial results, all kernels together
  uint32_t split_base;        // the split blockIdx.x 0 writes
  uint32_t blocks_per_split;  // 0: no blocks (a tail-only launch)
  bool with_tail;             // blockIdx.x 0 also takes the sequence's tail
  float* partial;             // [batch][splits][heads][kv + 2]: max, sum, then the sum of p * c
  unsigned long long* bad;
  // A tail-only launch (no blocks: e.g. the chosen tokens of an index_topk
  // under 64) spreads each sequence's tail over its splits, this many
  // tokens a split; 0: the tail is blockIdx.x 0's, whole.
  uint32_t tail_per_split = 0;
};

// The tensor-core kernel's shape: blocks of 64 tokens of 512 + 64, any
// codec, each block 16-byte aligned in the pool (cp.async copies 16 bytes).
inline bool TensorCoreShape(const MlaShape& shape, const PagedLatents& latents, size_t block_bytes) {
  return shape.kv_lora_rank == 512 && shape.rope_dim == 64 && latents.tokens_per_block == 64 && block_bytes % 16 == 0 &&
         reinterpret_cast<uintptr_t>(latents.pool) % 16 == 0;
}

// How many of the tensor-core kernel's CUDA blocks fit on a multiprocessor.
cudaError_t TensorCoreBlocksPerSm(Codec codec, int* blocks);

// Launches the tensor-core kernel over `grid_splits` splits of whole blocks
// (no tails), grid (splits, head groups of 16, batch). Returns the launch
// error.
cudaError_t LaunchTensorCorePartials(const Params& p, uint32_t grid_splits, uint32_t batch, cudaStream_t stream);

}  // namespace kvtier::kernels::cuda::internal

#endif  // KVTIER_KERNELS_CUDA_MLA_ATTENTION_INTERNAL_H_
