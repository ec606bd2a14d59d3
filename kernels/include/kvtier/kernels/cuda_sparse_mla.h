// DeepSeek-V3.2's sparse attention on the GPU, the same steps as the CPU's
// (indexer.h, services/runtime/sparse_attention.h): the lightning
// indexer's scores of every earlier token from its FP8 keys, the top-k
// tokens chosen from them, and those tokens' latents gathered from the
// paged blocks and tails into bf16 blocks of 64 and a float tail, which
// PagedMlaDecode then attends to as it does a sequence's own
// (cuda_mla_attention.h: V3.2's blocks on tensor cores). A step so reads
// every key but only the chosen tokens' latents.
// Built only with CUDA (KVTIER_HAVE_CUDA); callable from plain C++. All
// pointers are to device memory; every call queues on `stream` (a
// cudaStream_t; null: the default stream) and returns without waiting.
#ifndef KVTIER_KERNELS_CUDA_SPARSE_MLA_H_
#define KVTIER_KERNELS_CUDA_SPARSE_MLA_H_

#include <cstdint>

#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/cuda_mla_attention.h"
#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/status.h"

namespace kvtier::kernels::cuda {

// The keys the rows score: row r scores keys key_offsets[r] ..
// key_offsets[r] + visible[r] - 1 of `codes` ([keys][head_dim] e4m3) and
// `scales` ([keys] float), as IndexerScores (indexer.h) does for one row.
struct IndexerKeys {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  const int64_t* key_offsets = nullptr;  // [rows]
  const int32_t* visible = nullptr;      // [rows], each in 0..max_visible
  uint32_t max_visible = 0;
};

// scores[r][t] = scales[t] * sum_h weights[r][h] * max(q[r][h] . key_t, 0)
// for t < visible[r] (entries past it untouched): q_codes [rows][heads]
// [head_dim] e4m3, weights [rows][heads], scores [rows][max_visible]. The
// products of FP8 values are exact in float; each dot and the head sum
// are added in order. head_dim 16, 32, 64 or 128; else INVALID_ARGUMENT.
Status IndexerScores(uint32_t heads, uint32_t head_dim, uint32_t rows, const uint8_t* q_codes, const float* weights,
                     const IndexerKeys& keys, float* scores, void* stream);

// selected[r][0 .. counts[r]) = the min(k, visible[r]) tokens of row r
// with the highest scores (ties: the lower token), ascending: the CPU's
// SelectTopTokens, sorted. scores as IndexerScores wrote them; selected
// [rows][k]. -0 ranks as +0.
Status SelectTopTokens(uint32_t rows, const float* scores, uint32_t max_visible, const int32_t* visible, uint32_t k,
                       int32_t* selected, int32_t* counts, void* stream);

// out[r][i] = the latent (kv_lora_rank + rope_dim floats) of token
// selected[r][i] (i < counts[r]) of row r's sequence in `latents` (its
// blocks, then its tail: PagedLatents as PagedMlaDecode reads them), the
// same bits as the CPU's DequantizeTokens; out [rows][k][dim]. A token
// past its sequence, or a block index outside the pool, is noted in
// `fault` (set to kNoPagedMlaFault by the caller; PagedMlaFault reads it)
// and its row zeroed.
Status GatherLatents(const MlaShape& shape, const PagedLatents& latents, uint32_t rows, const int32_t* selected,
                     uint32_t k, const int32_t* counts, float* out, unsigned long long* fault, void* stream);

// The chosen tokens as PagedMlaDecode reads a sequence: blocks of this
// many tokens in the bf16 codec (the tensor cores' shape), the rest after
// them in float.
inline constexpr uint32_t kGatheredBlockTokens = 64;
KVTIER_HD inline size_t GatheredBlockBytes(const MlaShape& shape) {
  return size_t{kGatheredBlockTokens} * (shape.kv_lora_rank + shape.rope_dim) * 2;
}

// Where GatherLatentBlocks writes, for `rows` rows choosing up to k tokens
// (max_blocks = k / kGatheredBlockTokens): pool [rows][max_blocks] blocks
// of GatheredBlockBytes, block_table [rows][max_blocks], blocks [rows],
// tail [rows][kGatheredBlockTokens][kv_lora_rank + rope_dim] floats,
// tail_tokens [rows]. pool and block_table may be null when k < 64.
struct GatheredLatents {
  uint8_t* pool = nullptr;
  int32_t* block_table = nullptr;
  int32_t* blocks = nullptr;
  float* tail = nullptr;
  int32_t* tail_tokens = nullptr;
};

// GatherLatents's values, laid out for PagedMlaDecode: row r's first
// counts[r] / 64 * 64 chosen tokens, in order, as full bf16 blocks (each
// value rounded to bf16: exact for bf16 and fp8 latents, within 2^-9 of
// int8 and int4 ones), the rest in float in its tail; its block table,
// block count and tail count written to match. Faults as GatherLatents.
Status GatherLatentBlocks(const MlaShape& shape, const PagedLatents& latents, uint32_t rows, const int32_t* selected,
                          uint32_t k, const int32_t* counts, const GatheredLatents& out, unsigned long long* fault,
                          void* stream);

// The PagedLatents that PagedMlaDecode reads `gathered` as (the same rows
// and k as GatherLatentBlocks was given).
PagedLatents GatheredPagedLatents(const GatheredLatents& gathered, uint32_t rows, uint32_t k);

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_SPARSE_MLA_H_
