// DeepSeek-V3.2's sparse decode step against dense V3 attention, in
// process on the CPU: a model with V3.2's attention (128 heads, 512 + 64
// latents, q_lora 1536, a 64-head indexer of 128 dims choosing 2,048
// tokens; FP8 projections; 2 layers, small elsewhere) and the same model
// without its indexer (model_type deepseek_v3), each stepping sequences
// that hold `--context` tokens of latents in each codec, on 1 kernel
// thread and on every core, in the same run. A step reads every held
// token's indexer key (132 B a layer) but only the chosen tokens' latents,
// so its bytes grow with index_topk, not with the context. Each step is set
// against its memory roofline: the bytes it must read (weights,
// load/decode_roofline.h's latents or SparseStepStateBytes) at the host's
// copy rate measured in the same run. The caches are filled with random
// latents and keys instead of a prefill (a 64k-token prefill takes hours
// on a few cores; a step's time does not depend on the values). The GPU's
// sparse step is measured by kernels/cuda/check_sparse_mla.
//
//   sparse_decode_bench [--context 65536] [--codecs bf16,int8] [--sequences 1] [--steps 3]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "kvtier/kernels/parallel.h"
#include "load/decode_roofline.h"
#include "load/decode_steps.h"
#include "load/host_copy_rate.h"
#include "services/base/flags.h"
#include "services/base/status.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model.h"

namespace kvtier::runtime {
namespace {

constexpr uint32_t kTokensPerBlock = 64;

// V3.2's attention on lite-attn's small rest; `sparse` false: without its
// indexer (dense V3).
ModelConfig V32Attention(bool sparse) {
  ModelConfig c = *PresetConfig("lite-attn");
  c.model_type = sparse ? ModelType::kDeepseekV32 : ModelType::kDeepseekV3;
  c.num_attention_heads = 128;
  c.q_lora_rank = 1536;
  c.topk_method = TopkMethod::kNoauxTc;
  c.n_group = 1;
  c.topk_group = 1;
  c.norm_topk_prob = true;
  c.fp8 = Fp8Quantization{128, 128};
  if (sparse) c.indexer = IndexerConfig{64, 128, 2048};
  return c;
}

absl::StatusOr<std::unique_ptr<Model>> MakeAndLoad(const ModelConfig& config, const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvtier_sparse_bench_" + std::to_string(getpid()) + "_" + name);
  absl::StatusOr<std::unique_ptr<Model>> model = [&]() -> absl::StatusOr<std::unique_ptr<Model>> {
    KVTIER_RETURN_IF_ERROR(MakeModel(config, dir.string(), 3));
    KVTIER_ASSIGN_OR_RETURN(const std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(dir.string()));
    return Model::Load(*checkpoint);
  }();
  std::filesystem::remove_all(dir);
  return model;
}

// A cache of `context` tokens of random latents in `codec` (unit normals,
// as kv_a_layernorm leaves them), with random indexer keys when `keys` (any
// E4M3 code but NaN's, power-of-two scales, as the model rounds them).
absl::StatusOr<SequenceCache> RandomCache(const Model& model, kernels::Codec codec, size_t context, bool keys,
                                          std::mt19937& rng) {
  const ModelConfig& c = model.config();
  SequenceCache cache = model.NewCache(codec, kTokensPerBlock);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t row = static_cast<size_t>(c.kv_lora_rank + c.qk_rope_head_dim);
  for (size_t l = 0; l < static_cast<size_t>(c.num_hidden_layers); ++l) {
    cache.tail[l].resize(context * row);
    for (float& v : cache.tail[l]) v = normal(rng);
    KVTIER_RETURN_IF_ERROR(
        SealFullBlocks(cache, l, static_cast<uint32_t>(c.kv_lora_rank), static_cast<uint32_t>(c.qk_rope_head_dim)));
    if (!keys) continue;
    cache.index_keys[l].resize(context * c.indexer->head_dim);
    for (uint8_t& code : cache.index_keys[l]) code = static_cast<uint8_t>(rng() % 0x7f) | (rng() % 2 ? 0x80 : 0);
    cache.index_scales[l].resize(context);
    for (float& s : cache.index_scales[l]) s = std::ldexp(1.0f, static_cast<int>(rng() % 8) - 10);
  }
  cache.length = static_cast<int64_t>(context);
  return cache;
}

int Main(int argc, char** argv) {
  std::string codec_names = "bf16,int8";
  uint64_t context = 65536, sequences = 1, steps = 3;
  FlagParser flags("sparse_decode_bench [--context TOKENS] [--codecs bf16,int8] [--sequences N] [--steps N]",
                   "DeepSeek-V3.2's sparse decode step against dense V3 attention at a long context,\n"
                   "1 thread and every core, each against its memory roofline.");
  flags.AddUint("context", &context, "tokens each sequence holds before the timed steps (whole blocks of 64)");
  flags.AddString("codecs", &codec_names, "latent codecs, a set of rows each: bf16, fp8, int8, int4");
  flags.AddUint("sequences", &sequences, "sequences stepped together (1..64)");
  flags.AddUint("steps", &steps, "timed decode steps after the first");
  if (std::optional<int> exit =
          flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "sparse_decode_bench")) {
    return *exit;
  }
  std::vector<kernels::Codec> codecs;
  for (absl::string_view name : absl::StrSplit(codec_names, ',')) {
    std::optional<kernels::Codec> codec = kernels::ParseCodec(std::string_view(name.data(), name.size()));
    if (!codec.has_value()) {
      std::fprintf(stderr, "sparse_decode_bench: --codecs: '%s' is not bf16, fp8, int8 or int4\n",
                   std::string(name).c_str());
      return 2;
    }
    codecs.push_back(*codec);
  }
  if (context < kTokensPerBlock || context % kTokensPerBlock != 0 || sequences < 1 || sequences > 64) {
    std::fprintf(stderr, "sparse_decode_bench: --context must be whole blocks of %u, --sequences 1..64\n",
                 kTokensPerBlock);
    return 2;
  }
  steps = std::max<uint64_t>(steps, 1);
  struct Attention {
    const char* name;
    bool sparse;
    std::unique_ptr<Model> model;
  };
  std::vector<Attention> attentions;
  for (bool sparse : {false, true}) {
    absl::StatusOr<std::unique_ptr<Model>> model = MakeAndLoad(V32Attention(sparse), sparse ? "v32" : "v3");
    if (!model.ok()) {
      std::fprintf(stderr, "sparse_decode_bench: %s\n", model.status().ToString().c_str());
      return 1;
    }
    attentions.push_back({sparse ? "sparse V3.2" : "dense V3", sparse, *std::move(model)});
  }
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<size_t> thread_counts = {1};
  if (cores > 1) thread_counts.push_back(cores);
  std::vector<double> copy_gbs;
  for (size_t threads : thread_counts) {
    kernels::SetKernelThreads(threads);
    copy_gbs.push_back(load::HostCopyGBs());
  }
  const ModelConfig& v32 = attentions[1].model->config();
  std::printf("%zu sequence(s) of %zu tokens, V3.2's attention (index_topk %lld), %zu steps; copy rate (GB/s):",
              static_cast<size_t>(sequences), static_cast<size_t>(context), static_cast<long long>(v32.indexer->topk),
              static_cast<size_t>(steps));
  for (size_t i = 0; i < thread_counts.size(); ++i) std::printf(" %zu thread(s) %.1f;", thread_counts[i], copy_gbs[i]);
  std::printf("\n%-6s %-12s %7s %14s %10s %11s %9s %12s %10s %12s\n", "codec", "attention", "threads", "first step ms",
              "ms/step", "weights MB", "state MB", "roofline ms", "x roofline", "dense/sparse");
  std::mt19937 rng(1);
  for (kernels::Codec codec : codecs) {
    // The same latents for both: the sparse caches add the keys.
    std::vector<SequenceCache> dense_caches;
    for (uint64_t s = 0; s < sequences; ++s) {
      absl::StatusOr<SequenceCache> cache = RandomCache(*attentions[1].model, codec, context, true, rng);
      if (!cache.ok()) {
        std::fprintf(stderr, "sparse_decode_bench: %s\n", cache.status().ToString().c_str());
        return 1;
      }
      dense_caches.push_back(*std::move(cache));
    }
    std::vector<SequenceCache> sparse_caches = dense_caches;
    for (SequenceCache& c : dense_caches) c.index_keys.clear(), c.index_scales.clear();
    for (size_t i = 0; i < thread_counts.size(); ++i) {
      kernels::SetKernelThreads(thread_counts[i]);
      double dense_ms = 0;
      for (const Attention& a : attentions) {
        std::vector<SequenceCache> stepped = a.sparse ? sparse_caches : dense_caches;
        absl::StatusOr<double> first = load::TimeDecodeSteps(*a.model, stepped, 1);
        absl::StatusOr<double> seconds = first.ok() ? load::TimeDecodeSteps(*a.model, stepped, steps) : first;
        if (!seconds.ok()) {
          std::fprintf(stderr, "sparse_decode_bench: %s\n", seconds.status().ToString().c_str());
          return 1;
        }
        const ModelConfig& c = a.model->config();
        const load::StepBytes bytes = load::DecodeStepBytes(c, sequences, context, codec, kTokensPerBlock);
        const double state =
            a.sparse ? load::SparseStepStateBytes(c, sequences, context, codec, kTokensPerBlock) : bytes.latents;
        const double step_ms = *seconds / static_cast<double>(steps) * 1e3;
        const double roofline_ms = (bytes.weights + state) / (copy_gbs[i] * 1e9) * 1e3;
        if (!a.sparse) dense_ms = step_ms;
        std::printf("%-6s %-12s %7zu %14.1f %10.2f %11.1f %9.1f %12.3f %10.1f", kernels::CodecName(codec), a.name,
                    thread_counts[i], *first * 1e3, step_ms, bytes.weights / 1e6, state / 1e6, roofline_ms,
                    step_ms / roofline_ms);
        if (a.sparse) {
          std::printf(" %12.1f\n", dense_ms / step_ms);
        } else {
          std::printf(" %12s\n", "");
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::runtime

int main(int argc, char** argv) { return kvtier::runtime::Main(argc, argv); }
