// DeepSeek-V3.2's sparse attention on the GPU, the same steps as the CPU's
// (indexer.h, services/runtime/sparse_attention.h): the lightning
// indexer's scores of every earlier token from its FP8 keys, the top-k
// tokens chosen from them, and those tokens' latents gathered as float rows
// from the paged blocks and tails, which PagedMlaDecode then attends to as
// a tail-only launch (cuda_mla_attention.h). A step so reads every key but
// only the chosen tokens' latents.
// Built only with CUDA (KVTIER_HAVE_CUDA); callable from plain C++. All
// pointers are to device memory; every call queues on `stream` (a
// cudaStream_t; null: the default stream) and returns without waiting.
#ifndef KVTIER_KERNELS_CUDA_SPARSE_MLA_H_
#define KVTIER_KERNELS_CUDA_SPARSE_MLA_H_

#include <cstdint>

#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/cuda_mla_attention.h"
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

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_SPARSE_MLA_H_
