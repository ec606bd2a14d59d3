// Absorbed MLA decode attention on the GPU over a paged pool of quantized
// latent blocks (FlashMLA's job, for kvtier's codecs): for a batch of
// sequences of different lengths, one new token each, every head attends to
// its sequence's blocks (found through a block table) and then to its tail
// (the tokens not yet in a full block, in float). The same mathematics as
// the CPU's AbsorbedMlaDecode (mla_attention.h), per sequence:
//
//   out[b][h] = sum_t softmax_t(scale * q[b][h] . k_t) * c_t
//   lse[b][h] = log sum_t exp(scale * q[b][h] . k_t)
//
// Long contexts are split over several CUDA blocks, each over a range of the
// sequence's blocks, and the partial results combined by log-sum-exp.
// Built only with CUDA (KVTIER_HAVE_CUDA); callable from plain C++.
#ifndef KVTIER_KERNELS_CUDA_MLA_ATTENTION_H_
#define KVTIER_KERNELS_CUDA_MLA_ATTENTION_H_

#include <cstddef>
#include <cstdint>

#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/mla_attention.h"
#include "kvtier/kernels/status.h"

namespace kvtier::kernels::cuda {

// One layer's latents for a batch, all pointers to device memory.
struct PagedLatents {
  Codec codec = Codec::kBf16;
  uint32_t tokens_per_block = 0;
  // Blocks of EncodedBytes(codec, {tokens_per_block, kv_lora_rank,
  // rope_dim}) bytes, back to back.
  const uint8_t* pool = nullptr;
  uint32_t pool_blocks = 0;
  // [batch][max_blocks_per_sequence] indices into the pool, and how many of
  // each row are the sequence's (full) blocks, in order.
  const int32_t* block_table = nullptr;
  uint32_t max_blocks_per_sequence = 0;
  const int32_t* blocks_per_sequence = nullptr;  // [batch]
  // [batch][max_tail][kv_lora_rank + rope_dim] floats and [batch] counts:
  // each sequence's last tokens, after its blocks. Null when max_tail is 0.
  const float* tail = nullptr;
  const int32_t* tail_tokens = nullptr;
  uint32_t max_tail = 0;
  // Optional [batch] first token of each sequence's tail in `tail`, which
  // then holds tail_capacity tokens: sequences may share a tail (each row
  // of a prefill sees a longer prefix of the same one). Null: sequence b's
  // tail starts at token b * max_tail.
  const int64_t* tail_offsets = nullptr;
  uint64_t tail_capacity = 0;
  // Optional [batch] block-table row of each sequence, so that several may
  // share one (a prefill's rows all read their sequence's blocks); the table
  // then has block_table_height rows. Null: sequence b reads row b.
  const int32_t* block_table_rows = nullptr;
  uint32_t block_table_height = 0;
};

// q: [batch][heads][kv_lora_rank + rope_dim] (q_latent then q_rope, as the
// CPU's q_latent and q_rope side by side); out: [batch][heads][kv_lora_rank];
// lse: [batch][heads], or null. Runs on `stream` (a cudaStream_t; null: the
// default stream) and waits for it, unless options.fault is given.
// INVALID_ARGUMENT for shapes or pointers that do not fit, and (found on the
// device) a block index outside the pool, a count outside its row, or a
// sequence with no context, naming the first such sequence; INTERNAL for a
// CUDA error.
//
// Blocks of 64 tokens of 512 + 64 (DeepSeek-V2/V3), any codec, run on
// tensor cores: dequantized to fp16, with the query and the softmax weights
// rounded to fp16 (each output channel within a few 1e-3 of
// sum_t p_t |c_t|, the scale of its weighted sum, as
// kernels/cuda/check_mla_attention.cc checks); tails, and every other
// shape, run in float32 on CUDA cores.
struct PagedMlaOptions {
  bool tensor_cores = true;  // false: CUDA cores only
  // Null: PagedMlaDecode waits and reports what the device found. Else a
  // device word, set to kNoPagedMlaFault by the caller, where the kernels
  // note the first bad input; PagedMlaDecode then returns without waiting
  // (any host memory it was given may go), and the caller, having waited
  // and read the word back, hands it to PagedMlaFault. One word may serve
  // many calls (it keeps the lowest sequence's fault).
  unsigned long long* fault = nullptr;
  // Null: a call takes its scratch (partial results, and the fault word
  // when it waits) from the stream's memory pool and gives it back. Else
  // device memory of workspace_bytes, at least PagedMlaWorkspaceBytes for
  // the call's arguments (less: INVALID_ARGUMENT), used instead, so that a
  // call allocates nothing; calls queued on one stream may share it.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};
inline constexpr unsigned long long kNoPagedMlaFault = ~0ull;
// OK for kNoPagedMlaFault, else INVALID_ARGUMENT saying what the kernels
// found.
Status PagedMlaFault(unsigned long long fault);

// The workspace PagedMlaDecode needs for these arguments (options'
// tensor_cores and fault count; its workspace does not); 0 for arguments
// it refuses.
size_t PagedMlaWorkspaceBytes(const MlaShape& shape, const PagedLatents& latents, uint32_t batch,
                              const PagedMlaOptions& options = PagedMlaOptions());

Status PagedMlaDecode(const MlaShape& shape, const PagedLatents& latents, uint32_t batch, const float* q,
                      float softmax_scale, float* out, float* lse, void* stream,
                      const PagedMlaOptions& options = PagedMlaOptions());

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_MLA_ATTENTION_H_
