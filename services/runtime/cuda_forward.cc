#include "services/runtime/cuda_forward.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtier/kernels/cuda_codec.h"
#include "kvtier/kernels/cuda_device.h"
#include "kvtier/kernels/cuda_layers.h"
#include "kvtier/kernels/cuda_matmul.h"
#include "kvtier/kernels/cuda_mla_attention.h"
#include "kvtier/kernels/cuda_sparse_mla.h"
#include "kvtier/kernels/float_formats.h"
#include "services/base/status.h"
#include "services/runtime/device_array.h"
#include "services/runtime/device_block_pool.h"
#include "services/runtime/matmul.h"
#include "services/runtime/model_weights.h"
#include "services/runtime/sparse_attention.h"

namespace kvtier::runtime {
namespace {

namespace kc = kernels::cuda;

absl::Status Check(const kernels::Status& s) { return FromKernelStatus(s); }

// One SwiGLU MLP's weights on the device.
struct DeviceMlp {
  DeviceArray<uint16_t> gate, up, down;
  uint32_t inter = 0;
  kc::SwiGluDeviceWeights View() const { return {gate.data(), up.data(), down.data(), inter}; }
};

// V3.2's indexer of a layer: its projections on the device; its key norm
// on the host, which rounds keys and queries as the CPU does.
struct DeviceIndexer {
  DeviceArray<uint16_t> wq_b, wk, weights_proj;
  std::vector<float> k_norm, k_norm_bias;
};

// A layer's weights on the device: matrices bf16 (row-major [out][in], as
// checkpoints store them), norms float.
struct DeviceLayer {
  DeviceArray<float> input_norm, post_norm, q_a_norm, kv_a_norm;
  DeviceArray<uint16_t> q_proj, q_a, q_b, kv_a, o_proj;
  DeviceArray<uint16_t> w_uk_t;  // [heads][kv][nope]: q_latent = W_UK^T q_nope, per head
  DeviceArray<uint16_t> w_uv;    // [heads][v][kv]
  bool moe = false;
  DeviceMlp mlp;  // dense layers
  DeviceArray<uint16_t> router;
  std::vector<float> correction_bias;  // noaux_tc's: the gate chooses on the host
  std::vector<DeviceMlp> experts;
  DeviceMlp shared;               // inter 0: none
  kc::MoeDeviceWeights moe_view;  // points into router, experts and shared
  std::optional<DeviceIndexer> indexer;
};

// `latents` from row r on: its per-row arrays advanced.
kc::PagedLatents FromRow(kc::PagedLatents latents, size_t r) {
  latents.block_table_rows += r;
  latents.blocks_per_sequence += r;
  latents.tail_tokens += r;
  latents.tail_offsets += r;
  return latents;
}

class CudaForward final : public ForwardBackend {
 public:
  CudaForward(const ModelConfig& config, const kernels::RopeTable& rope, const CudaOptions& options)
      : config_(config), rope_(rope), options_(options) {}

  absl::Status Load(const Checkpoint& checkpoint);
  absl::Status Forward(std::span<const SequenceTokens> batch,
                       const std::function<void(size_t layer)>& on_layer) override;

 private:
  // Queues the pass on stream_, waiting only where the host needs results
  // (each layer's new latents; an MoE layer's gate logits). Forward then
  // waits for the rest, whatever this returned.
  absl::Status QueuePass(std::span<const SequenceTokens> batch, const std::function<void(size_t layer)>& on_layer);
  absl::Status LoadLayer(const Checkpoint& checkpoint, int64_t index, DeviceLayer& l);
  absl::Status UploadBf16(const Checkpoint& checkpoint, const TensorSpec& spec, DeviceArray<uint16_t>& out);
  absl::Status UploadFloat(const Checkpoint& checkpoint, const TensorSpec& spec, DeviceArray<float>& out);
  // Queues a copy of `host` into `to` on the pass's stream, keeping `host`
  // until the pass has waited for it.
  template <typename T>
  absl::Status Upload(std::vector<T> host, DeviceArray<T>& to) {
    auto kept = std::make_shared<const std::vector<T>>(std::move(host));
    kept_.push_back(kept);
    return to.Upload(*kept, stream_);
  }
  // Waits for the pass's queued work (a pass's every return goes through
  // here): only then may kept_ go, and the callers' caches and logits.
  absl::Status WaitForPass(const char* what);
  // Attention of the rows of `seqs` (one codec and block size; rows from
  // `first_row` of the pass on), each over its sequence's blocks of layer
  // li and the tail up to its own token: q_full -> attn_latent.
  absl::Status Attend(std::span<const SequenceTokens> seqs, size_t li, size_t first_row);
  // V3.2: keys the pass's rows into their caches (ix_host_: the indexer's
  // projections, downloaded) and chooses each row's tokens on the device
  // (ix_selected_, ix_counts_), every key of its sequence scored.
  absl::Status ChooseTokens(std::span<const SequenceTokens> batch, size_t li);
  // Attention of `rows` rows from `row` over their chosen tokens (latents:
  // as Attend places them, from that row on), gathered into bf16 blocks
  // and a float tail (kc::GatherLatentBlocks).
  absl::Status AttendChosen(const kc::PagedLatents& latents, size_t rows, size_t row);
  // One attention call for `rows` rows from `first_row` of the pass
  // (q_full -> attn_latent) over `latents`, in the pass's workspace.
  absl::Status AttendRows(const kernels::MlaShape& shape, const kc::PagedLatents& latents, uint32_t rows,
                          size_t first_row);
  // The device block pool for blocks of `block_bytes`: made at first use
  // for that size (options_.block_pool_bytes); null for blocks of other
  // sizes, or when there is none (passes copy their blocks up).
  DeviceBlockPool* BlockPool(size_t block_bytes);

  const ModelConfig config_;
  const kernels::RopeTable rope_;
  const CudaOptions options_;
  // Declared before blas_, which is on it: destroyed after it.
  std::unique_ptr<kc::DeviceStream> stream_owner_;
  kc::StreamHandle stream_ = nullptr;  // stream_owner_'s
  std::unique_ptr<kc::Blas> blas_;     // on stream_
  WeightMatrix embed_;                 // host: a pass gathers its rows here
  DeviceArray<float> final_norm_;
  DeviceArray<uint16_t> lm_head_;
  std::vector<DeviceLayer> layers_;

  std::mutex mu_;  // one pass at a time: the stream and the scratch below are shared
  // Activations ([rows][...]) and the attention's inputs, grown as passes need.
  DeviceArray<float> x_, h_, qa_, q_, q_full_, latent_, latent_c_, attn_latent_, attn_, delta_, logits_, tails_;
  DeviceArray<int64_t> positions_, tail_offsets_;
  DeviceArray<uint8_t> pool_;  // a pass's blocks when they do not go through block_pool_
  std::unique_ptr<DeviceBlockPool> block_pool_;
  bool block_pool_tried_ = false;
  DeviceArray<int32_t> table_, table_rows_, block_counts_, tail_tokens_;
  // V3.2's indexer: its projections ([rows][...]), the rows' queries and
  // their sequences' keys, scores, and the tokens chosen ([rows][topk]).
  DeviceArray<float> ix_keys_, ix_queries_, ix_head_weights_, ix_weights_, ix_key_scales_, ix_scores_;
  DeviceArray<uint8_t> ix_q_codes_, ix_key_codes_;
  DeviceArray<int64_t> ix_key_offsets_;
  DeviceArray<int32_t> ix_visible_, ix_selected_, ix_counts_;
  // The chosen tokens' latents as attention reads them (kc::GatheredLatents).
  DeviceArray<uint8_t> chosen_pool_;
  DeviceArray<int32_t> chosen_table_, chosen_blocks_, chosen_tail_tokens_;
  DeviceArray<float> chosen_tail_;
  std::vector<float> ix_host_;  // keys, then queries, then head weights
  // The lowest bad input the attention kernels found in a pass (they do not
  // wait; the pass reads it back at its end).
  DeviceArray<unsigned long long> attention_fault_;
  // Attention's scratch, kept so that a call allocates nothing.
  DeviceArray<uint8_t> attention_workspace_;
  unsigned long long attention_fault_seen_ = 0;    // its value, read back
  std::vector<std::shared_ptr<const void>> kept_;  // host sources of queued copies
};

absl::Status CudaForward::WaitForPass(const char* what) {
  const kernels::Status waited = stream_owner_->Synchronize(what);
  kept_.clear();
  return Check(waited);
}

// FP8 projections dequantized here, at load: the GPU multiplies in bf16.
absl::Status CudaForward::UploadBf16(const Checkpoint& checkpoint, const TensorSpec& spec, DeviceArray<uint16_t>& out) {
  KVTIER_ASSIGN_OR_RETURN(const std::vector<float> values, LoadFloats(checkpoint, spec));
  return out.Assign(ToBf16(values));
}

absl::Status CudaForward::UploadFloat(const Checkpoint& checkpoint, const TensorSpec& spec, DeviceArray<float>& out) {
  KVTIER_ASSIGN_OR_RETURN(const std::vector<float> values, LoadFloats(checkpoint, spec));
  return out.Assign(values);
}

absl::Status CudaForward::Load(const Checkpoint& checkpoint) {
  std::string why;
  if (!kc::DevicePresent(&why))
    return absl::FailedPreconditionError(absl::StrCat("--device cuda: no usable GPU: ", why));
  KVTIER_RETURN_IF_ERROR(Check(kc::DeviceStream::Create(stream_owner_)));
  stream_ = stream_owner_->handle();
  KVTIER_RETURN_IF_ERROR(Check(kc::Blas::Create(stream_, blas_)));
  const GlobalTensors global = GlobalTensorsOf(config_);
  KVTIER_ASSIGN_OR_RETURN(embed_, LoadMatrix(checkpoint, global.embed));
  KVTIER_RETURN_IF_ERROR(UploadFloat(checkpoint, global.final_norm, final_norm_));
  KVTIER_RETURN_IF_ERROR(UploadBf16(checkpoint, global.lm_head, lm_head_));
  layers_.resize(static_cast<size_t>(config_.num_hidden_layers));
  for (size_t i = 0; i < layers_.size(); ++i) {
    KVTIER_RETURN_IF_ERROR(LoadLayer(checkpoint, static_cast<int64_t>(i), layers_[i]));
  }
  return absl::OkStatus();
}

absl::Status CudaForward::LoadLayer(const Checkpoint& ckpt, int64_t index, DeviceLayer& l) {
  const ModelConfig& c = config_;
  const LayerTensors t = LayerTensorsOf(c, index);
  KVTIER_RETURN_IF_ERROR(UploadFloat(ckpt, t.input_norm, l.input_norm));
  KVTIER_RETURN_IF_ERROR(UploadFloat(ckpt, t.post_norm, l.post_norm));
  if (t.q_a.has_value()) {
    KVTIER_RETURN_IF_ERROR(UploadBf16(ckpt, *t.q_a, l.q_a));
    KVTIER_RETURN_IF_ERROR(UploadFloat(ckpt, *t.q_a_norm, l.q_a_norm));
    KVTIER_RETURN_IF_ERROR(UploadBf16(ckpt, *t.q_b, l.q_b));
  } else {
    KVTIER_RETURN_IF_ERROR(UploadBf16(ckpt, *t.q_proj, l.q_proj));
  }
  KVTIER_RETURN_IF_ERROR(UploadBf16(ckpt, t.kv_a, l.kv_a));
  KVTIER_RETURN_IF_ERROR(UploadFloat(ckpt, t.kv_a_norm, l.kv_a_norm));
  // The GPU multiplies by W_UK^T per head: each head's [nope][kv] transposed.
  const size_t heads = c.num_attention_heads, nope = c.qk_nope_head_dim, kv = c.kv_lora_rank;
  KVTIER_ASSIGN_OR_RETURN(const std::vector<float> kv_b, LoadFloats(ckpt, t.kv_b));
  const KvBWeights split = SplitKvB(kv_b, c);
  std::vector<float> w_uk_t(heads * kv * nope);
  for (size_t h = 0; h < heads; ++h) {
    for (size_t i = 0; i < nope; ++i) {
      for (size_t j = 0; j < kv; ++j) w_uk_t[(h * kv + j) * nope + i] = split.w_uk[(h * nope + i) * kv + j];
    }
  }
  KVTIER_RETURN_IF_ERROR(l.w_uk_t.Assign(ToBf16(w_uk_t)));
  KVTIER_RETURN_IF_ERROR(l.w_uv.Assign(ToBf16(split.w_uv)));
  KVTIER_RETURN_IF_ERROR(UploadBf16(ckpt, t.o_proj, l.o_proj));
  if (t.indexer.has_value()) {
    DeviceIndexer& ix = l.indexer.emplace();
    KVTIER_RETURN_IF_ERROR(UploadBf16(ckpt, t.indexer->wq_b, ix.wq_b));
    KVTIER_RETURN_IF_ERROR(UploadBf16(ckpt, t.indexer->wk, ix.wk));
    KVTIER_RETURN_IF_ERROR(UploadBf16(ckpt, t.indexer->weights_proj, ix.weights_proj));
    KVTIER_ASSIGN_OR_RETURN(ix.k_norm, LoadFloats(ckpt, t.indexer->k_norm));
    KVTIER_ASSIGN_OR_RETURN(ix.k_norm_bias, LoadFloats(ckpt, t.indexer->k_norm_bias));
  }
  auto load_mlp = [&](const MlpTensors& mlp, DeviceMlp& m) -> absl::Status {
    m.inter = static_cast<uint32_t>(mlp.inter);
    KVTIER_RETURN_IF_ERROR(UploadBf16(ckpt, mlp.gate, m.gate));
    KVTIER_RETURN_IF_ERROR(UploadBf16(ckpt, mlp.up, m.up));
    return UploadBf16(ckpt, mlp.down, m.down);
  };
  l.moe = t.moe;
  if (!l.moe) return load_mlp(*t.mlp, l.mlp);
  KVTIER_RETURN_IF_ERROR(UploadBf16(ckpt, *t.router, l.router));
  if (t.correction_bias.has_value()) {
    KVTIER_ASSIGN_OR_RETURN(l.correction_bias, LoadFloats(ckpt, *t.correction_bias));
  }
  l.experts.resize(static_cast<size_t>(c.n_routed_experts));
  for (size_t e = 0; e < l.experts.size(); ++e) {
    KVTIER_RETURN_IF_ERROR(load_mlp(ExpertTensors(c, index, static_cast<int64_t>(e)), l.experts[e]));
  }
  if (t.shared.has_value()) KVTIER_RETURN_IF_ERROR(load_mlp(*t.shared, l.shared));
  l.moe_view.router = l.router.data();
  for (const DeviceMlp& e : l.experts) l.moe_view.experts.push_back(e.View());
  l.moe_view.shared = l.shared.View();
  l.moe_view.gate = c.Gate();
  l.moe_view.gate.correction_bias = l.correction_bias;
  return absl::OkStatus();
}

DeviceBlockPool* CudaForward::BlockPool(size_t block_bytes) {
  if (!block_pool_tried_) {
    block_pool_tried_ = true;
    size_t bytes = static_cast<size_t>(std::max<int64_t>(options_.block_pool_bytes, 0)), free = 0, total = 0;
    if (options_.block_pool_bytes < 0 && kc::DeviceMemory(free, total)) bytes = free / 10 * 4;
    const size_t slots = std::min<size_t>(bytes / block_bytes, INT32_MAX);
    if (slots > 0) {
      absl::StatusOr<std::unique_ptr<DeviceBlockPool>> pool =
          DeviceBlockPool::Create(block_bytes, static_cast<uint32_t>(slots));
      if (pool.ok()) block_pool_ = *std::move(pool);
    }
  }
  return block_pool_ != nullptr && block_pool_->block_bytes() == block_bytes ? block_pool_.get() : nullptr;
}

absl::Status CudaForward::Attend(std::span<const SequenceTokens> seqs, size_t li, size_t first_row) {
  const ModelConfig& c = config_;
  const uint32_t heads = static_cast<uint32_t>(c.num_attention_heads), kv = static_cast<uint32_t>(c.kv_lora_rank),
                 rope = static_cast<uint32_t>(c.qk_rope_head_dim), dim = kv + rope;
  const SequenceCache& first = *seqs[0].cache;
  const size_t block_bytes = kernels::EncodedBytes(first.codec, {first.tokens_per_block, kv, rope});
  if (block_bytes == 0) return absl::InvalidArgumentError("the codec does not take blocks of this shape");
  size_t max_blocks = 0;
  for (const SequenceTokens& s : seqs) max_blocks = std::max(max_blocks, s.cache->blocks[li].size());
  // The sequences' blocks, in order: kept in the device block pool between
  // passes where they fit, else copied up back to back for this pass.
  std::vector<const SealedBlock*> needed;
  for (const SequenceTokens& s : seqs) {
    for (const SealedBlock& block : s.cache->blocks[li]) {
      if (block.size() != block_bytes) {
        return absl::InvalidArgumentError(absl::StrCat("a ", kernels::CodecName(first.codec), " block of layer ", li,
                                                       " has ", block.size(), " bytes, not ", block_bytes));
      }
      needed.push_back(&block);
    }
  }
  std::vector<int32_t> slot_of;
  bool pooled = false;
  if (DeviceBlockPool* pool = BlockPool(block_bytes); pool != nullptr) {
    KVTIER_ASSIGN_OR_RETURN(pooled, pool->Place(needed, stream_, slot_of));
  }
  if (!pooled) {
    std::vector<uint8_t> copy;
    copy.reserve(needed.size() * block_bytes);
    for (size_t k = 0; k < needed.size(); ++k) {
      copy.insert(copy.end(), needed[k]->begin(), needed[k]->end());
      slot_of.push_back(static_cast<int32_t>(k));
    }
    KVTIER_RETURN_IF_ERROR(Upload(std::move(copy), pool_));
  }
  // A sequence's block-table row and tail are shared by its pass rows.
  std::vector<float> tails;
  std::vector<int32_t> table, table_rows, counts, tail_tokens;
  std::vector<int64_t> offsets;
  uint32_t max_tail = 0;
  int32_t next_block = 0;
  for (size_t seq = 0; seq < seqs.size(); ++seq) {
    const SequenceTokens& s = seqs[seq];
    const SequenceCache& cache = *s.cache;
    const int32_t base = next_block, blocks = static_cast<int32_t>(cache.blocks[li].size());
    next_block += blocks;
    const int64_t tail_start = static_cast<int64_t>(tails.size() / dim);
    const int64_t sealed = int64_t{blocks} * cache.tokens_per_block;
    const int64_t held = static_cast<int64_t>(cache.tail[li].size() / dim);
    tails.insert(tails.end(), cache.tail[li].begin(), cache.tail[li].end());
    for (int32_t j = 0; j < static_cast<int32_t>(max_blocks); ++j) table.push_back(j < blocks ? slot_of[base + j] : -1);
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      // Causal: a row sees the tail up to and including its own token.
      const int64_t visible = cache.length + static_cast<int64_t>(i) - sealed + 1;
      if (visible < 1 || visible > held) {
        return absl::InvalidArgumentError(absl::StrCat("a sequence cache holds ", held, " tail tokens at layer ", li,
                                                       ", not the ", visible, " its length implies"));
      }
      counts.push_back(blocks);
      table_rows.push_back(static_cast<int32_t>(seq));
      offsets.push_back(tail_start);
      tail_tokens.push_back(static_cast<int32_t>(visible));
      max_tail = std::max(max_tail, static_cast<uint32_t>(visible));
    }
  }
  const size_t rows = counts.size(), tail_capacity = tails.size() / dim;
  KVTIER_RETURN_IF_ERROR(Upload(std::move(table), table_));
  KVTIER_RETURN_IF_ERROR(Upload(std::move(table_rows), table_rows_));
  KVTIER_RETURN_IF_ERROR(Upload(std::move(counts), block_counts_));
  KVTIER_RETURN_IF_ERROR(Upload(std::move(tails), tails_));
  KVTIER_RETURN_IF_ERROR(Upload(std::move(offsets), tail_offsets_));
  KVTIER_RETURN_IF_ERROR(Upload(std::move(tail_tokens), tail_tokens_));
  kc::PagedLatents latents;
  latents.codec = first.codec;
  latents.tokens_per_block = first.tokens_per_block;
  latents.pool = pooled ? block_pool_->base() : pool_.data();
  latents.pool_blocks = pooled ? block_pool_->slots() : static_cast<uint32_t>(needed.size());
  latents.block_table = max_blocks > 0 ? table_.data() : nullptr;
  latents.max_blocks_per_sequence = static_cast<uint32_t>(max_blocks);
  latents.blocks_per_sequence = block_counts_.data();
  latents.tail = tails_.data();
  latents.tail_tokens = tail_tokens_.data();
  latents.max_tail = max_tail;
  latents.tail_offsets = tail_offsets_.data();
  latents.tail_capacity = tail_capacity;
  latents.block_table_rows = table_rows_.data();
  latents.block_table_height = static_cast<uint32_t>(seqs.size());
  if (layers_[li].indexer.has_value()) return AttendChosen(latents, rows, first_row);
  // Rows in chunks: the kernel's grid holds at most 65535 rows and its
  // workspace a partial result per row and split (kept near 256 MiB).
  const size_t chunk = std::clamp<size_t>((size_t{1} << 28) / (size_t{8} * heads * (kv + 2)), 1, 32768);
  for (size_t r = 0; r < rows; r += chunk) {
    KVTIER_RETURN_IF_ERROR(AttendRows({heads, kv, rope}, FromRow(latents, r),
                                      static_cast<uint32_t>(std::min(chunk, rows - r)), first_row + r));
  }
  return absl::OkStatus();
}

absl::Status CudaForward::AttendRows(const kernels::MlaShape& shape, const kc::PagedLatents& latents, uint32_t rows,
                                     size_t first_row) {
  const size_t dim = size_t{shape.kv_lora_rank} + shape.rope_dim;
  kc::PagedMlaOptions options;
  options.fault = attention_fault_.data();
  options.workspace_bytes = kc::PagedMlaWorkspaceBytes(shape, latents, rows, options);
  KVTIER_RETURN_IF_ERROR(attention_workspace_.Reserve(std::max<size_t>(options.workspace_bytes, 1)));
  options.workspace = attention_workspace_.data();
  return Check(kc::PagedMlaDecode(
      shape, latents, rows, q_full_.data() + first_row * shape.heads * dim, static_cast<float>(config_.SoftmaxScale()),
      attn_latent_.data() + first_row * shape.heads * shape.kv_lora_rank, nullptr, stream_, options));
}

absl::Status CudaForward::ChooseTokens(std::span<const SequenceTokens> batch, size_t li) {
  const IndexerConfig& ix = *config_.indexer;
  const DeviceIndexer& w = *layers_[li].indexer;
  const size_t heads = ix.heads, dim = ix.head_dim, topk = ix.topk;
  const std::vector<PassRow> rows = PassRows(batch);
  const size_t n = rows.size();
  std::span<float> keys = std::span(ix_host_).first(n * dim),
                   queries = std::span(ix_host_).subspan(n * dim, n * heads * dim),
                   head_weights = std::span(ix_host_).subspan(n * (dim + heads * dim), n * heads);
  KVTIER_RETURN_IF_ERROR(AppendIndexKeys(rope_, w.k_norm, w.k_norm_bias, li, rows, keys));
  std::vector<uint8_t> q_codes(n * heads * dim);
  std::vector<float> weights(n * heads);
  for (size_t r = 0; r < n; ++r) {
    KVTIER_RETURN_IF_ERROR(IndexQuery(
        ix, rope_, rows[r].pos, queries.subspan(r * heads * dim, heads * dim), head_weights.subspan(r * heads, heads),
        std::span(q_codes).subspan(r * heads * dim, heads * dim), std::span(weights).subspan(r * heads, heads)));
  }
  // Each sequence's keys once; its rows see a prefix of them.
  std::vector<uint8_t> key_codes;
  std::vector<float> key_scales;
  std::vector<int64_t> offsets;
  std::vector<int32_t> visible;
  for (const SequenceTokens& s : batch) {
    const int64_t first = static_cast<int64_t>(key_scales.size());
    const std::vector<float>& scales = s.cache->index_scales[li];
    key_codes.insert(key_codes.end(), s.cache->index_keys[li].begin(), s.cache->index_keys[li].end());
    key_scales.insert(key_scales.end(), scales.begin(), scales.end());
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const int64_t sees = s.cache->length + static_cast<int64_t>(i) + 1;
      if (sees > static_cast<int64_t>(scales.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("a sequence cache holds ", scales.size(), " indexer keys at layer ", li, ", not ", sees));
      }
      offsets.push_back(first);
      visible.push_back(static_cast<int32_t>(sees));
    }
  }
  const uint32_t max_visible = static_cast<uint32_t>(*std::max_element(visible.begin(), visible.end()));
  KVTIER_RETURN_IF_ERROR(Upload(std::move(q_codes), ix_q_codes_));
  KVTIER_RETURN_IF_ERROR(Upload(std::move(weights), ix_weights_));
  KVTIER_RETURN_IF_ERROR(Upload(std::move(key_codes), ix_key_codes_));
  KVTIER_RETURN_IF_ERROR(Upload(std::move(key_scales), ix_key_scales_));
  KVTIER_RETURN_IF_ERROR(Upload(std::move(offsets), ix_key_offsets_));
  KVTIER_RETURN_IF_ERROR(Upload(std::move(visible), ix_visible_));
  KVTIER_RETURN_IF_ERROR(ix_selected_.Reserve(n * topk));
  KVTIER_RETURN_IF_ERROR(ix_counts_.Reserve(n));
  // Rows in chunks whose scores stay near 256 MiB.
  const size_t chunk = std::clamp<size_t>((size_t{1} << 26) / max_visible, 1, 65535);
  KVTIER_RETURN_IF_ERROR(ix_scores_.Reserve(std::min(chunk, n) * max_visible));
  for (size_t r = 0; r < n; r += chunk) {
    const uint32_t count = static_cast<uint32_t>(std::min(chunk, n - r));
    const kc::IndexerKeys keys_of_rows{ix_key_codes_.data(), ix_key_scales_.data(), ix_key_offsets_.data() + r,
                                       ix_visible_.data() + r, max_visible};
    KVTIER_RETURN_IF_ERROR(Check(kc::IndexerScores(static_cast<uint32_t>(heads), static_cast<uint32_t>(dim), count,
                                                   ix_q_codes_.data() + r * heads * dim, ix_weights_.data() + r * heads,
                                                   keys_of_rows, ix_scores_.data(), stream_)));
    KVTIER_RETURN_IF_ERROR(Check(kc::SelectTopTokens(count, ix_scores_.data(), max_visible, ix_visible_.data() + r,
                                                     static_cast<uint32_t>(topk), ix_selected_.data() + r * topk,
                                                     ix_counts_.data() + r, stream_)));
  }
  return absl::OkStatus();
}

absl::Status CudaForward::AttendChosen(const kc::PagedLatents& latents, size_t rows, size_t row) {
  const ModelConfig& c = config_;
  const uint32_t heads = static_cast<uint32_t>(c.num_attention_heads), kv = static_cast<uint32_t>(c.kv_lora_rank),
                 dim = kv + static_cast<uint32_t>(c.qk_rope_head_dim), topk = static_cast<uint32_t>(c.indexer->topk);
  const kernels::MlaShape shape{heads, kv, dim - kv};
  // The chosen tokens in bf16 blocks (so that V3.2's take the tensor
  // cores) and float tails; rows in chunks whose copies stay near 256 MiB.
  const size_t blocks_per_row = topk / kc::kGatheredBlockTokens;
  const size_t row_bytes = blocks_per_row * kc::GatheredBlockBytes(shape) + size_t{kc::kGatheredBlockTokens} * dim * 4;
  const size_t chunk = std::clamp<size_t>((size_t{1} << 28) / row_bytes, 1, 32768), most = std::min(chunk, rows);
  KVTIER_RETURN_IF_ERROR(
      chosen_pool_.Reserve(std::max<size_t>(most * blocks_per_row * kc::GatheredBlockBytes(shape), 1)));
  KVTIER_RETURN_IF_ERROR(chosen_table_.Reserve(std::max<size_t>(most * blocks_per_row, 1)));
  KVTIER_RETURN_IF_ERROR(chosen_blocks_.Reserve(most));
  KVTIER_RETURN_IF_ERROR(chosen_tail_.Reserve(most * kc::kGatheredBlockTokens * dim));
  KVTIER_RETURN_IF_ERROR(chosen_tail_tokens_.Reserve(most));
  const kc::GatheredLatents gathered{chosen_pool_.data(), chosen_table_.data(), chosen_blocks_.data(),
                                     chosen_tail_.data(), chosen_tail_tokens_.data()};
  for (size_t r = 0; r < rows; r += chunk) {
    const uint32_t count = static_cast<uint32_t>(std::min(chunk, rows - r));
    const size_t at = row + r;
    KVTIER_RETURN_IF_ERROR(
        Check(kc::GatherLatentBlocks(shape, FromRow(latents, r), count, ix_selected_.data() + at * topk, topk,
                                     ix_counts_.data() + at, gathered, attention_fault_.data(), stream_)));
    KVTIER_RETURN_IF_ERROR(AttendRows(shape, kc::GatheredPagedLatents(gathered, count, topk), count, at));
  }
  return absl::OkStatus();
}

absl::Status CudaForward::Forward(std::span<const SequenceTokens> batch,
                                  const std::function<void(size_t layer)>& on_layer) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Status queued = QueuePass(batch, on_layer);
  const absl::Status ran = WaitForPass("forward pass (a fault in its queued work)");
  KVTIER_RETURN_IF_ERROR(queued);
  KVTIER_RETURN_IF_ERROR(ran);
  KVTIER_RETURN_IF_ERROR(Check(kc::PagedMlaFault(attention_fault_seen_)));
  for (const SequenceTokens& s : batch) s.cache->length += static_cast<int64_t>(s.tokens.size());
  return absl::OkStatus();
}

absl::Status CudaForward::QueuePass(std::span<const SequenceTokens> batch,
                                    const std::function<void(size_t layer)>& on_layer) {
  const ModelConfig& c = config_;
  const uint32_t hidden = static_cast<uint32_t>(c.hidden_size), heads = static_cast<uint32_t>(c.num_attention_heads),
                 nope = static_cast<uint32_t>(c.qk_nope_head_dim), rope = static_cast<uint32_t>(c.qk_rope_head_dim),
                 qdim = static_cast<uint32_t>(c.q_head_dim()), kv = static_cast<uint32_t>(c.kv_lora_rank),
                 v = static_cast<uint32_t>(c.v_head_dim), dim = kv + rope,
                 q_lora = static_cast<uint32_t>(c.q_lora_rank.value_or(0)), vocab = static_cast<uint32_t>(c.vocab_size);
  const float eps = static_cast<float>(c.rms_norm_eps);
  // One row per token, sequences one after another.
  std::vector<int64_t> positions;
  std::vector<float> x;
  for (const SequenceTokens& s : batch) {
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      positions.push_back(s.cache->length + static_cast<int64_t>(i));
      x.resize(x.size() + hidden);
      EmbeddingRow(embed_, s.tokens[i], hidden, x.data() + x.size() - hidden);
    }
  }
  const uint32_t n = static_cast<uint32_t>(positions.size());
  static_assert(kc::kNoPagedMlaFault == ~0ull, "the fault word is set with a 0xff memset");
  KVTIER_RETURN_IF_ERROR(Upload(std::move(x), x_));
  KVTIER_RETURN_IF_ERROR(Upload(std::move(positions), positions_));
  KVTIER_RETURN_IF_ERROR(attention_fault_.Reserve(1));
  KVTIER_RETURN_IF_ERROR(Check(
      kc::FillQueued(attention_fault_.data(), 0xff, sizeof(unsigned long long), stream_, "attention fault word")));
  attention_fault_seen_ = kc::kNoPagedMlaFault;
  for (auto [array, size] :
       {std::pair(&h_, size_t{hidden}), std::pair(&qa_, size_t{q_lora}), std::pair(&q_, size_t{heads} * qdim),
        std::pair(&q_full_, size_t{heads} * dim), std::pair(&latent_, size_t{dim}), std::pair(&latent_c_, size_t{kv}),
        std::pair(&attn_latent_, size_t{heads} * kv), std::pair(&attn_, size_t{heads} * v),
        std::pair(&delta_, size_t{hidden})}) {
    KVTIER_RETURN_IF_ERROR(array->Reserve(std::max<size_t>(size_t{n} * size, 1)));
  }
  std::vector<float> latents(size_t{n} * dim);
  for (size_t li = 0; li < layers_.size(); ++li) {
    const DeviceLayer& l = layers_[li];
    KVTIER_RETURN_IF_ERROR(Check(kc::RmsNorm(x_.data(), l.input_norm.data(), n, hidden, eps, h_.data(), stream_)));
    if (q_lora > 0) {
      KVTIER_RETURN_IF_ERROR(Check(blas_->Gemm(l.q_a.data(), q_lora, hidden, h_.data(), n, qa_.data())));
      KVTIER_RETURN_IF_ERROR(Check(kc::RmsNorm(qa_.data(), l.q_a_norm.data(), n, q_lora, eps, qa_.data(), stream_)));
      KVTIER_RETURN_IF_ERROR(Check(blas_->Gemm(l.q_b.data(), heads * qdim, q_lora, qa_.data(), n, q_.data())));
    } else {
      KVTIER_RETURN_IF_ERROR(Check(blas_->Gemm(l.q_proj.data(), heads * qdim, hidden, h_.data(), n, q_.data())));
    }
    // The new latents: normalised compressed part, rotated rope part; the
    // host's sequence caches keep them.
    KVTIER_RETURN_IF_ERROR(Check(blas_->Gemm(l.kv_a.data(), dim, hidden, h_.data(), n, latent_.data())));
    KVTIER_RETURN_IF_ERROR(Check(kc::Copy2DQueued(latent_c_.data(), kv * 4, latent_.data(), dim * 4, kv * 4, n,
                                                  kc::Copy::kDeviceToDevice, stream_, "latent copy")));
    KVTIER_RETURN_IF_ERROR(
        Check(kc::RmsNorm(latent_c_.data(), l.kv_a_norm.data(), n, kv, eps, latent_c_.data(), stream_)));
    KVTIER_RETURN_IF_ERROR(Check(kc::Copy2DQueued(latent_.data(), dim * 4, latent_c_.data(), kv * 4, kv * 4, n,
                                                  kc::Copy::kDeviceToDevice, stream_, "latent copy")));
    KVTIER_RETURN_IF_ERROR(
        Check(kc::ApplyRope(rope_, positions_.data(), latent_.data() + kv, n, 1, dim, dim, stream_)));
    KVTIER_RETURN_IF_ERROR(Check(kc::CopyQueued(latents.data(), latent_.data(), latents.size() * 4,
                                                kc::Copy::kDeviceToHost, stream_, "latent download")));
    if (l.indexer.has_value()) {  // its projections, rounded on the host
      const uint32_t ix_heads = static_cast<uint32_t>(c.indexer->heads),
                     ix_dim = static_cast<uint32_t>(c.indexer->head_dim);
      const size_t keys = size_t{n} * ix_dim, queries = size_t{n} * ix_heads * ix_dim, weights = size_t{n} * ix_heads;
      KVTIER_RETURN_IF_ERROR(ix_keys_.Reserve(keys));
      KVTIER_RETURN_IF_ERROR(ix_queries_.Reserve(queries));
      KVTIER_RETURN_IF_ERROR(ix_head_weights_.Reserve(weights));
      KVTIER_RETURN_IF_ERROR(Check(blas_->Gemm(l.indexer->wk.data(), ix_dim, hidden, h_.data(), n, ix_keys_.data())));
      KVTIER_RETURN_IF_ERROR(
          Check(blas_->Gemm(l.indexer->wq_b.data(), ix_heads * ix_dim, q_lora, qa_.data(), n, ix_queries_.data())));
      KVTIER_RETURN_IF_ERROR(
          Check(blas_->Gemm(l.indexer->weights_proj.data(), ix_heads, hidden, h_.data(), n, ix_head_weights_.data())));
      ix_host_.resize(keys + queries + weights);
      for (auto [from, at, size] :
           {std::tuple(ix_keys_.data(), size_t{0}, keys), std::tuple(ix_queries_.data(), keys, queries),
            std::tuple(ix_head_weights_.data(), keys + queries, weights)}) {
        KVTIER_RETURN_IF_ERROR(Check(kc::CopyQueued(ix_host_.data() + at, from, size * 4, kc::Copy::kDeviceToHost,
                                                    stream_, "indexer projections download")));
      }
    }
    KVTIER_RETURN_IF_ERROR(Check(stream_owner_->Synchronize("latent download (or work queued before it)")));
    {
      size_t r = 0;
      for (const SequenceTokens& s : batch) {
        std::vector<float>& tail = s.cache->tail[li];
        tail.insert(tail.end(), latents.begin() + r * dim, latents.begin() + (r + s.tokens.size()) * dim);
        r += s.tokens.size();
      }
    }
    if (l.indexer.has_value()) KVTIER_RETURN_IF_ERROR(ChooseTokens(batch, li));
    // Queries in the latent space, [n][heads][kv | rope]: W_UK folded in
    // per head, the rope part rotated.
    KVTIER_RETURN_IF_ERROR(Check(blas_->GroupedGemm(l.w_uk_t.data(), kv, nope, heads, q_.data(), size_t{heads} * qdim,
                                                    qdim, n, q_full_.data(), size_t{heads} * dim, dim)));
    KVTIER_RETURN_IF_ERROR(
        Check(kc::Copy2DQueued(q_full_.data() + kv, dim * 4, q_.data() + nope, qdim * 4, rope * 4, size_t{n} * heads,
                               kc::Copy::kDeviceToDevice, stream_, "query copy")));
    KVTIER_RETURN_IF_ERROR(Check(
        kc::ApplyRope(rope_, positions_.data(), q_full_.data() + kv, n, heads, size_t{heads} * dim, dim, stream_)));
    // Attention, one launch per run of sequences stored alike.
    for (size_t b = 0, row = 0; b < batch.size();) {
      size_t end = b + 1, rows = batch[b].tokens.size();
      while (end < batch.size() && batch[end].cache->codec == batch[b].cache->codec &&
             batch[end].cache->tokens_per_block == batch[b].cache->tokens_per_block) {
        rows += batch[end++].tokens.size();
      }
      KVTIER_RETURN_IF_ERROR(Attend(batch.subspan(b, end - b), li, row));
      b = end, row += rows;
    }
    KVTIER_RETURN_IF_ERROR(Check(blas_->GroupedGemm(l.w_uv.data(), v, kv, heads, attn_latent_.data(),
                                                    size_t{heads} * kv, kv, n, attn_.data(), size_t{heads} * v, v)));
    KVTIER_RETURN_IF_ERROR(Check(blas_->Gemm(l.o_proj.data(), hidden, heads * v, attn_.data(), n, delta_.data())));
    KVTIER_RETURN_IF_ERROR(Check(kc::AddInPlace(x_.data(), delta_.data(), size_t{n} * hidden, stream_)));
    KVTIER_RETURN_IF_ERROR(Check(kc::RmsNorm(x_.data(), l.post_norm.data(), n, hidden, eps, h_.data(), stream_)));
    KVTIER_RETURN_IF_ERROR(Check(l.moe ? blas_->MoeForward(l.moe_view, hidden, h_.data(), n, delta_.data())
                                       : blas_->SwiGlu(l.mlp.View(), hidden, h_.data(), n, delta_.data())));
    KVTIER_RETURN_IF_ERROR(Check(kc::AddInPlace(x_.data(), delta_.data(), size_t{n} * hidden, stream_)));
    // Every row has attended at this layer: its full blocks can be sealed.
    for (const SequenceTokens& s : batch) KVTIER_RETURN_IF_ERROR(SealFullBlocks(*s.cache, li, kv, rope));
    if (on_layer) on_layer(li);
  }
  // Logits after each sequence's last token.
  const uint32_t sequences = static_cast<uint32_t>(batch.size());
  KVTIER_RETURN_IF_ERROR(logits_.Reserve(size_t{sequences} * vocab));
  size_t end = 0;
  for (uint32_t b = 0; b < sequences; ++b) {
    end += batch[b].tokens.size();
    KVTIER_RETURN_IF_ERROR(Check(kc::CopyQueued(h_.data() + size_t{b} * hidden, x_.data() + (end - 1) * hidden,
                                                size_t{hidden} * 4, kc::Copy::kDeviceToDevice, stream_, "last rows")));
  }
  KVTIER_RETURN_IF_ERROR(Check(kc::RmsNorm(h_.data(), final_norm_.data(), sequences, hidden, eps, h_.data(), stream_)));
  KVTIER_RETURN_IF_ERROR(Check(blas_->Gemm(lm_head_.data(), vocab, hidden, h_.data(), sequences, logits_.data())));
  // Straight into each caller's logits (no host buffer of our own to fault
  // in and copy out of).
  for (uint32_t b = 0; b < sequences; ++b) {
    KVTIER_RETURN_IF_ERROR(Check(kc::CopyQueued(batch[b].logits.data(), logits_.data() + size_t{b} * vocab,
                                                size_t{vocab} * 4, kc::Copy::kDeviceToHost, stream_, "logits")));
  }
  return Check(kc::CopyQueued(&attention_fault_seen_, attention_fault_.data(), sizeof attention_fault_seen_,
                              kc::Copy::kDeviceToHost, stream_, "attention fault word"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ForwardBackend>> LoadCudaForward(const Checkpoint& checkpoint,
                                                                const kernels::RopeTable& rope,
                                                                const CudaOptions& options) {
  auto forward = std::make_unique<CudaForward>(checkpoint.config(), rope, options);
  KVTIER_RETURN_IF_ERROR(forward->Load(checkpoint));
  return forward;
}

}  // namespace kvtier::runtime
