// The forward pass of a DeepSeek-V2 or V3-family model over a batch of
// sequences, attending over each sequence's stored latents: full blocks
// kept in a codec (bf16/fp8/int8/int4, as the cache stores them), the
// partial tail in float. (A DeepSeek-V4 model runs v4_forward.h instead.) It runs on a backend: the CPU (cpu_forward.h:
// decode steps use absorbed MLA directly on the stored codes, prefill
// passes the expanded form when it costs fewer multiply-adds) or a GPU
// (cuda_forward.h: every row takes the absorbed form).
#ifndef KVTIER_SERVICES_RUNTIME_MODEL_H_
#define KVTIER_SERVICES_RUNTIME_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/kernels/codec.h"
#include "kvtier/kernels/rope.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/sealed_block.h"
#include "services/runtime/v4_state.h"

namespace kvtier::runtime {

// One sequence's latents, per layer: sealed blocks of tokens_per_block
// tokens in `codec`, then float rows of the tokens after them. Not
// thread-safe.
struct SequenceCache {
  kernels::Codec codec = kernels::Codec::kBf16;
  uint32_t tokens_per_block = 64;
  int64_t length = 0;                            // tokens whose latents are held
  std::vector<std::vector<SealedBlock>> blocks;  // [layer][block]
  std::vector<std::vector<float>> tail;          // [layer] rows
  // DeepSeek-V3.2: every held token's indexer key, [layer] index_head_dim
  // FP8 codes a token and [layer] one scale a token (sparse_attention.h).
  std::vector<std::vector<uint8_t>> index_keys = {};
  std::vector<std::vector<float>> index_scales = {};
  // DeepSeek-V4: [layer] the window, compressed entries and open groups
  // (then blocks and tail stay empty).
  std::vector<V4LayerState> v4 = {};
  // When set, V4 passes record their window entries and choices in it.
  V4Trace* v4_trace = nullptr;
  // When set, [layer] gets the float rows of each block as it is sealed
  // (to check another implementation's codecs against the same latents).
  std::vector<std::vector<float>>* sealed_rows = nullptr;
};

// The whole blocks `cache` holds: its sealed ones, or the blocks a V4
// sequence has completed (v4_cache_parts.h cuts them).
inline size_t FullBlocks(const SequenceCache& cache) {
  if (!cache.v4.empty()) return static_cast<size_t>(cache.length) / cache.tokens_per_block;
  return cache.blocks.empty() ? 0 : cache.blocks[0].size();
}

// One sequence's part of a forward pass: `tokens` run at positions
// cache->length, cache->length + 1, ...; `logits` (vocab_size floats) gets
// the next-token logits after the last of them.
struct SequenceTokens {
  std::span<const uint32_t> tokens;
  SequenceCache* cache = nullptr;
  std::span<float> logits;
};

// A layer's kv_b_proj ([heads][nope + v][kv_lora_rank] rows) split into
// W_UK ([heads][nope][kv]) and W_UV ([heads][v][kv]), as both backends use
// them.
struct KvBWeights {
  std::vector<float> w_uk, w_uv;
};
KvBWeights SplitKvB(std::span<const float> kv_b, const ModelConfig& config);

// `--device`'s help, for every program that takes it.
inline constexpr char kDeviceFlagHelp[] =
    "cpu|cuda: where the model runs (cpu: weights as the checkpoint stores them, FP8 read as FP8; cuda: bf16 "
    "weights on the first GPU, FP8 ones dequantized at load)";

// Quantizes the full blocks at the front of `layer`'s tail into blocks.
absl::Status SealFullBlocks(SequenceCache& cache, size_t layer, uint32_t kv_lora_rank, uint32_t rope_dim);

// Runs Model's layers with the weights it loaded: cpu_forward.h,
// cuda_forward.h. Each loads from model_tensors.h's description.
class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;
  // Model::Forward, on a batch Model has checked; advances each cache's
  // length once the pass is done.
  virtual absl::Status Forward(std::span<const SequenceTokens> batch,
                               const std::function<void(size_t layer)>& on_layer) = 0;
};

// Where the forward pass runs: --device cpu|cuda.
enum class Device { kCpu, kCuda };
// INVALID_ARGUMENT naming the choices for anything but "cpu" or "cuda".
absl::StatusOr<Device> ParseDevice(const std::string& name);

// How a pass on a GPU keeps sequences' sealed blocks in its memory between
// passes (device_block_pool.h).
struct CudaOptions {
  // Bytes of the device block pool: -1, 40% of the GPU memory free when it
  // is first needed; 0, none (every pass copies its blocks up).
  int64_t block_pool_bytes = -1;
};

// The weights, loaded once: in host memory for the CPU (projections as the
// checkpoint stores them, bf16, FP8 with block scales or float32; norms and
// the rest float32); bf16 in GPU memory for CUDA. Immutable after Load;
// thread-safe (passes on a GPU take turns).
class Model {
 public:
  // FAILED_PRECONDITION for kCuda in a build without CUDA or on a machine
  // without a usable GPU, saying which.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const Checkpoint& checkpoint, Device device = Device::kCpu,
                                                     const CudaOptions& cuda = CudaOptions());

  const ModelConfig& config() const { return config_; }
  // The checkpoint's tokenizer_class (tokenizer.h); empty when it has none.
  const std::string& tokenizer_class() const { return tokenizer_class_; }
  // An empty sequence's cache (a V4 model's: its v4 state; codec and
  // tokens_per_block do not apply to it).
  SequenceCache NewCache(kernels::Codec codec, uint32_t tokens_per_block) const;

  // Runs every sequence's tokens as one causal pass: each projection reads
  // its weights once for all rows of the batch (prefill of a prompt is a
  // batch of one sequence with many tokens; a decode step is many sequences
  // with one token each; both can mix). Each token attends over its own
  // sequence's stored blocks and the full-precision latents of the tokens
  // before it in the pass; the blocks the pass fills are sealed into the
  // codec layer by layer, once every row has attended. Each sequence takes
  // the cheaper attention form for its rows (kernels::MlaFormCosts:
  // absorbed for decode steps and short suffixes, expanded for prefills).
  // On the CPU a sequence's results do not depend on what else is in the
  // batch (bit for bit); on a GPU, cuBLAS may pick other kernels for other
  // batch sizes, so only within the GPU's tolerance. INVALID_ARGUMENT, with every cache untouched, for an empty
  // batch or token list, a token outside the vocabulary, a logits span or
  // cache that does not fit, or the same cache twice; any later error leaves
  // the caches unusable. `on_layer(l)`, when given, runs as soon as layer l
  // is done and its filled blocks are sealed (so a prefill node can send
  // them while the next layers compute).
  using LayerDone = std::function<void(size_t layer)>;
  absl::Status Forward(std::span<const SequenceTokens> batch, const LayerDone& on_layer = {}) const;

  // Forward for one sequence: a prompt (or its uncached suffix), or one
  // decode step.
  absl::Status Prefill(std::span<const uint32_t> tokens, SequenceCache& cache, std::span<float> logits) const;
  absl::Status Step(uint32_t token, SequenceCache& cache, std::span<float> logits) const;

 private:
  Model() = default;
  absl::Status CheckBatch(std::span<const SequenceTokens> batch) const;

  ModelConfig config_;
  std::string tokenizer_class_;
  kernels::RopeTable rope_;
  std::unique_ptr<ForwardBackend> backend_;
};

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_MODEL_H_
