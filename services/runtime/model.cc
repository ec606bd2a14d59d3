#include "services/runtime/model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
#include "services/runtime/cpu_forward.h"
#include "services/runtime/v4_forward.h"
#if KVTIER_RUNTIME_CUDA
#include "services/runtime/cuda_accelerator.h"
#include "services/runtime/cuda_forward.h"
#endif

namespace kvtier::runtime {
namespace {

absl::Status Check(const kernels::Status& s) { return FromKernelStatus(s); }

[[maybe_unused]] absl::Status NoCudaBackend() {
  return absl::FailedPreconditionError(
      "--device cuda: this build has no CUDA backend (nvcc was not found when it was configured)");
}

}  // namespace

absl::StatusOr<Device> ParseDevice(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return absl::InvalidArgumentError(absl::StrCat("--device ", name, " is not one of cpu, cuda"));
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const Checkpoint& ckpt, Device device,
                                                   [[maybe_unused]] const CudaOptions& cuda) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = ckpt.config();
  m->tokenizer_class_ = ckpt.tokenizer_class();
  const ModelConfig& c = m->config_;
  if (c.v4.has_value()) {
    std::unique_ptr<Accelerator> products;
    if (device == Device::kCuda) {
#if KVTIER_RUNTIME_CUDA
      KVTIER_ASSIGN_OR_RETURN(products, NewCudaAccelerator());
#else
      return NoCudaBackend();
#endif
    }
    KVTIER_ASSIGN_OR_RETURN(m->backend_, LoadV4Forward(ckpt, std::move(products)));
    return m;
  }
  const kernels::YarnParams* yarn = c.rope_scaling.has_value() ? &*c.rope_scaling : nullptr;
  KVTIER_RETURN_IF_ERROR(
      Check(kernels::RopeTable::Create(static_cast<uint32_t>(c.qk_rope_head_dim), c.rope_theta, yarn, m->rope_)));
  if (device == Device::kCuda) {
#if KVTIER_RUNTIME_CUDA
    KVTIER_ASSIGN_OR_RETURN(m->backend_, LoadCudaForward(ckpt, m->rope_, cuda));
    return m;
#else
    return NoCudaBackend();
#endif
  }
  KVTIER_ASSIGN_OR_RETURN(m->backend_, LoadCpuForward(ckpt, m->rope_));
  return m;
}

SequenceCache Model::NewCache(kernels::Codec codec, uint32_t tokens_per_block) const {
  SequenceCache cache;
  cache.codec = codec;
  cache.tokens_per_block = tokens_per_block;
  if (config_.v4.has_value()) {
    cache.v4 = NewV4State(config_);
    return cache;
  }
  cache.blocks.resize(static_cast<size_t>(config_.num_hidden_layers));
  cache.tail.resize(static_cast<size_t>(config_.num_hidden_layers));
  if (config_.indexer.has_value()) {
    cache.index_keys.resize(static_cast<size_t>(config_.num_hidden_layers));
    cache.index_scales.resize(static_cast<size_t>(config_.num_hidden_layers));
  }
  return cache;
}

absl::Status Model::Step(uint32_t token, SequenceCache& cache, std::span<float> logits) const {
  return Prefill(std::span(&token, 1), cache, logits);
}

absl::Status Model::Prefill(std::span<const uint32_t> tokens, SequenceCache& cache, std::span<float> logits) const {
  const SequenceTokens one{tokens, &cache, logits};
  return Forward(std::span(&one, 1));
}

absl::Status Model::CheckBatch(std::span<const SequenceTokens> batch) const {
  const ModelConfig& c = config_;
  if (batch.empty()) return absl::InvalidArgumentError("no sequences to run");
  for (size_t b = 0; b < batch.size(); ++b) {
    const SequenceTokens& s = batch[b];
    if (s.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("sequence ", b, " has no tokens to run"));
    for (uint32_t token : s.tokens) {
      if (token >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token ", token, " outside the vocabulary of ", c.vocab_size));
      }
    }
    const size_t layers = static_cast<size_t>(c.num_hidden_layers);
    if (s.cache == nullptr || s.logits.size() != static_cast<size_t>(c.vocab_size) ||
        (c.v4.has_value() ? s.cache->v4.size() != layers
                          : s.cache->tail.size() != layers || s.cache->blocks.size() != layers)) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", b, ": logits or cache do not fit this model"));
    }
    if (c.indexer.has_value() && !c.v4.has_value()) {  // V3.2: keys beside the latents
      bool keyed = s.cache->index_scales.size() == static_cast<size_t>(c.num_hidden_layers) &&
                   s.cache->index_keys.size() == s.cache->index_scales.size();
      for (size_t l = 0; keyed && l < s.cache->index_scales.size(); ++l) {
        keyed = s.cache->index_scales[l].size() == static_cast<size_t>(s.cache->length) &&
                s.cache->index_keys[l].size() == s.cache->index_scales[l].size() * c.indexer->head_dim;
      }
      if (!keyed) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", b, ": the cache lacks its tokens' indexer keys (DeepSeek-V3.2)"));
      }
    }
    for (size_t other = 0; other < b; ++other) {
      if (batch[other].cache == s.cache) {
        return absl::InvalidArgumentError(absl::StrCat("sequences ", other, " and ", b, " share a cache"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Model::Forward(std::span<const SequenceTokens> batch, const LayerDone& on_layer) const {
  KVTIER_RETURN_IF_ERROR(CheckBatch(batch));
  return backend_->Forward(batch, on_layer);
}

KvBWeights SplitKvB(std::span<const float> kv_b, const ModelConfig& c) {
  const size_t heads = c.num_attention_heads, nope = c.qk_nope_head_dim, v = c.v_head_dim, kv = c.kv_lora_rank;
  KvBWeights w{std::vector<float>(heads * nope * kv), std::vector<float>(heads * v * kv)};
  // Per head: nope rows of W_UK, then v rows of W_UV.
  for (size_t h = 0; h < heads; ++h) {
    const float* head = kv_b.data() + h * (nope + v) * kv;
    std::copy_n(head, nope * kv, w.w_uk.data() + h * nope * kv);
    std::copy_n(head + nope * kv, v * kv, w.w_uv.data() + h * v * kv);
  }
  return w;
}

absl::Status SealFullBlocks(SequenceCache& cache, size_t li, uint32_t kv_lora_rank, uint32_t rope_dim) {
  const kernels::BlockShape shape{cache.tokens_per_block, kv_lora_rank, rope_dim};
  std::vector<float>& tail = cache.tail[li];
  size_t sealed = 0;
  while (tail.size() - sealed >= shape.values()) {
    if (cache.sealed_rows != nullptr) {
      if (cache.sealed_rows->size() <= li) cache.sealed_rows->resize(li + 1);
      (*cache.sealed_rows)[li].insert((*cache.sealed_rows)[li].end(), tail.begin() + static_cast<ptrdiff_t>(sealed),
                                      tail.begin() + static_cast<ptrdiff_t>(sealed + shape.values()));
    }
    std::vector<uint8_t> payload(kernels::EncodedBytes(cache.codec, shape));
    KVTIER_RETURN_IF_ERROR(Check(
        kernels::Quantize(cache.codec, shape, std::span<const float>(tail).subspan(sealed, shape.values()), payload)));
    cache.blocks[li].push_back(std::move(payload));
    sealed += shape.values();
  }
  tail.erase(tail.begin(), tail.begin() + static_cast<ptrdiff_t>(sealed));
  return absl::OkStatus();
}

}  // namespace kvtier::runtime
