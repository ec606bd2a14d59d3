#include "services/runtime/make_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/qat_rounding.h"
#include "services/base/status.h"
#include "services/runtime/model_tensors.h"
#include "services/runtime/safetensors.h"
#include "services/runtime/v4_tensors.h"

namespace kvtier::runtime {

absl::StatusOr<ModelConfig> PresetConfig(const std::string& preset) {
  ModelConfig c;
  if (preset == "tiny") {
    c.vocab_size = 256;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.moe_intermediate_size = 32;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.q_lora_rank = 48;
    c.kv_lora_rank = 32;
    c.qk_nope_head_dim = 16;
    c.qk_rope_head_dim = 8;
    c.v_head_dim = 16;
    c.n_routed_experts = 8;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 3;
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
    c.n_group = 4;
    c.topk_group = 2;
    c.first_k_dense_replace = 1;
    c.max_position_embeddings = 2048;
    c.rope_scaling = kernels::YarnParams{4.0, 512, 32.0, 1.0, 0.707, 0.707};
    return c;
  }
  if (preset == "lite-attn") {
    c.vocab_size = 1024;
    c.hidden_size = 2048;
    c.intermediate_size = 1024;
    c.moe_intermediate_size = 256;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 16;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.n_routed_experts = 8;
    c.n_shared_experts = 2;
    c.num_experts_per_tok = 2;
    c.first_k_dense_replace = 1;
    c.max_position_embeddings = 163840;
    c.rope_scaling = kernels::YarnParams{40.0, 4096, 32.0, 1.0, 0.707, 0.707};  // as V2-Lite
    return c;
  }
  if (preset == "v3-tiny") {
    // DeepSeek-V3's shape, small: q_lora, the noaux_tc router over groups,
    // one shared expert, two dense layers first, YaRN as V3's, FP8
    // projections in 128 x 128 blocks with partial ones at every edge
    // (hidden 200, q_lora 136, experts' 144), an MTP layer.
    c.model_type = ModelType::kDeepseekV3;
    c.vocab_size = 256;
    c.hidden_size = 200;
    c.intermediate_size = 272;
    c.moe_intermediate_size = 144;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.q_lora_rank = 136;
    c.kv_lora_rank = 32;
    c.qk_nope_head_dim = 16;
    c.qk_rope_head_dim = 8;
    c.v_head_dim = 16;
    c.n_routed_experts = 16;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 4;
    c.topk_method = TopkMethod::kNoauxTc;
    c.n_group = 4;
    c.topk_group = 2;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5;
    c.first_k_dense_replace = 2;
    c.max_position_embeddings = 163840;
    c.rope_scaling = kernels::YarnParams{40.0, 4096, 32.0, 1.0, 1.0, 1.0};  // as V3
    c.fp8 = Fp8Quantization{128, 128};
    c.num_nextn_predict_layers = 1;
    return c;
  }
  if (preset == "kimi-k2-tiny") {
    // Kimi-K2's: model_type kimi_k2 on V3's architecture, no group limit
    // (n_group 1), one dense layer, its own scaling factor and RoPE base,
    // FP8 with partial blocks (hidden 160), no MTP layer.
    c.model_type = ModelType::kKimiK2;
    c.vocab_size = 320;
    c.hidden_size = 160;
    c.intermediate_size = 288;
    c.moe_intermediate_size = 136;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 2;
    c.q_lora_rank = 144;
    c.kv_lora_rank = 32;
    c.qk_nope_head_dim = 16;
    c.qk_rope_head_dim = 8;
    c.v_head_dim = 16;
    c.n_routed_experts = 24;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 4;
    c.topk_method = TopkMethod::kNoauxTc;
    c.n_group = 1;
    c.topk_group = 1;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.827;
    c.first_k_dense_replace = 1;
    c.rope_theta = 50000.0;
    c.max_position_embeddings = 131072;
    c.rope_scaling = kernels::YarnParams{32.0, 4096, 1.0, 1.0, 1.0, 1.0};
    c.fp8 = Fp8Quantization{128, 128};
    return c;
  }
  if (preset == "v32-tiny") {
    // DeepSeek-V3.2's: v3-tiny with a lightning indexer in every layer, its
    // top-k small (8) so that short prompts attend sparsely.
    absl::StatusOr<ModelConfig> v32 = PresetConfig("v3-tiny");
    v32->model_type = ModelType::kDeepseekV32;
    v32->indexer = IndexerConfig{4, 16, 8};
    return v32;
  }
  if (preset == "v4-tiny") {
    // DeepSeek-V4's shape, small: window-only layers first, then CSA (ratio
    // 4, with the indexer) and HCA layers alternating, the HCA ratio (8)
    // and the window (16) small so that short prompts cross the window and
    // close groups of both; hash-routed first layers, YaRN on compressed
    // layers, hyper-connections of 4 copies, the grouped output.
    c.model_type = ModelType::kDeepseekV4;
    c.vocab_size = 256;
    c.hidden_size = 64;
    c.num_hidden_layers = 5;
    c.num_attention_heads = 4;
    c.q_lora_rank = 48;
    c.qk_rope_head_dim = 16;
    c.n_routed_experts = 8;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 32;
    c.routed_scaling_factor = 1.5;
    c.max_position_embeddings = 4096;
    c.rope_scaling = kernels::YarnParams{4.0, 64, 32.0, 1.0, 1.0, 1.0};
    c.indexer = IndexerConfig{4, 32, 4};
    V4Config& v4 = c.v4.emplace();
    v4.head_dim = 80;
    v4.sliding_window = 16;
    v4.compress_ratios = {0, 4, 8, 4, 8};
    v4.o_groups = 2;
    v4.o_lora_rank = 32;
    v4.num_hash_layers = 2;
    v4.swiglu_limit = 10.0;
    return c;
  }
  if (preset == "v4-tiny-fp8") {
    // v4-tiny as DeepSeek-V4 is released: FP8 projections with E8M0 block
    // scales, MXFP4 routed experts; the inputs of those products are whole
    // blocks of 128 (hidden, q_lora, the experts' and wo_b's widths), as
    // the model's GEMMs need.
    absl::StatusOr<ModelConfig> fp8 = PresetConfig("v4-tiny");
    fp8->hidden_size = 128;
    fp8->q_lora_rank = 128;
    fp8->moe_intermediate_size = 128;
    fp8->v4->o_lora_rank = 64;
    fp8->fp8 = Fp8Quantization{128, 128};
    fp8->v4->fp4_experts = true;
    return fp8;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown preset '", preset, "' (tiny, lite-attn, v3-tiny, kimi-k2-tiny, v32-tiny, v4-tiny, v4-tiny-fp8)"));
}

int PublishedShards(const ModelConfig& config) {
  return config.model_type == ModelType::kDeepseekV2 || config.v4.has_value() ? 1 : 3;
}

namespace {

// Hugging Face's shard file names: model-00001-of-00003.safetensors.
std::string ShardName(size_t index, int shards) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, shards);
}

// Random values for `spec`: norms near 1, projections N(0, 1/fan_in), a
// wider lm_head so greedy choices have clear margins, correction biases
// wide enough to change which experts and groups win; a hash router's
// table (integers) gives each token distinct experts.
std::vector<float> RandomValues(const TensorSpec& spec, std::mt19937_64& rng, std::normal_distribution<float>& normal,
                                const ModelConfig& config) {
  int64_t n = 1;
  for (int64_t d : spec.shape) n *= d;
  if (spec.dtype == DType::kI32) {
    std::vector<float> ids;
    std::vector<float> experts(static_cast<size_t>(config.n_routed_experts));
    for (int64_t token = 0; token < spec.shape[0]; ++token) {
      std::iota(experts.begin(), experts.end(), 0.0f);
      std::shuffle(experts.begin(), experts.end(), rng);
      ids.insert(ids.end(), experts.begin(), experts.begin() + spec.shape[1]);
    }
    return ids;
  }
  float stddev = 1.0f, mean = 0.0f;
  if (absl::EndsWith(spec.name, "norm.weight")) {
    mean = 1.0f;
    stddev = 0.1f;
  } else if (absl::EndsWith(spec.name, "norm.bias")) {
    stddev = 0.1f;
  } else if (absl::EndsWith(spec.name, "e_score_correction_bias")) {
    mean = -0.2f;
    stddev = 0.5f;
  } else if (spec.shape.size() == 2 && !absl::EndsWith(spec.name, "embed_tokens.weight") &&
             spec.name != "embed.weight") {
    stddev = 1.0f / std::sqrt(static_cast<float>(spec.shape[1]));
    if (absl::EndsWith(spec.name, "head.weight")) stddev *= 4.0f;
  }
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = mean + stddev * normal(rng);
  return values;
}

// `values` ([rows][cols]) in FP8 as DeepSeek quantizes its weights: per
// block, scale = amax / 448 (V3's F32 scales) or the power of two at or
// above it (V4's E8M0 ones), and codes = values / scale rounded to E4M3.
// Returns the codes' values (exact in F8_E4M3) and fills `scales`.
std::vector<float> QuantizeFp8Blocks(const std::vector<float>& values, const TensorSpec& spec,
                                     const TensorSpec& scale_spec, const Fp8Quantization& fp8, bool power_of_two_scales,
                                     std::vector<float>& scales) {
  const int64_t rows = spec.shape[0], cols = spec.shape[1], scale_cols = scale_spec.shape[1];
  scales.assign(static_cast<size_t>(scale_spec.shape[0] * scale_cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& amax = scales[(r / fp8.block_rows) * scale_cols + c / fp8.block_cols];
      amax = std::max(amax, std::fabs(values[r * cols + c]));
    }
  for (float& s : scales) {
    if (s == 0) {
      s = 1.0f;
    } else {
      s = power_of_two_scales ? kernels::PowerOfTwoAtLeast(s / kernels::kFp8E4m3Max) : s / kernels::kFp8E4m3Max;
    }
  }
  std::vector<float> codes(values.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float scale = scales[(r / fp8.block_rows) * scale_cols + c / fp8.block_cols];
      codes[r * cols + c] = kernels::Fp8E4m3ToFloat(kernels::FloatToFp8E4m3(values[r * cols + c] / scale));
    }
  return codes;
}

// DeepSeek-V4's MXFP4 expert from its values [rows][cols]: the packed
// bytes (two E2M1 codes each, the lower column low; written as I8) and
// E8M0 scales per 32.
std::vector<float> QuantizeV4Fp4(const std::vector<float>& values, int64_t rows, int64_t cols,
                                 std::vector<float>& scales) {
  scales.clear();
  std::vector<float> bytes(static_cast<size_t>(rows * cols / 2));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float* block = values.data() + r * cols + b * 32;
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(block[i]));
      const float scale = amax > 0 ? kernels::PowerOfTwoAtLeast(amax / 6.0f) : 1.0f;
      scales.push_back(scale);
      for (int i = 0; i < 32; i += 2) {
        const auto code = [&](float v) { return kernels::NearestE2m1Code(std::clamp(v / scale, -6.0f, 6.0f)); };
        const int packed = code(block[i]) | code(block[i + 1]) << 4;
        bytes[static_cast<size_t>((r * cols + b * 32 + i) / 2)] = static_cast<float>(static_cast<int8_t>(packed));
      }
    }
  }
  return bytes;
}

}  // namespace

absl::Status MakeModel(const ModelConfig& config, const std::string& out_dir, uint64_t seed, int shards) {
  namespace fs = std::filesystem;
  if (shards < 1) return absl::InvalidArgumentError("shards must be at least 1");
  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot create ", out_dir, ": ", error.message()));
  {
    std::ofstream out(fs::path(out_dir) / "config.json");
    out << config.ToJson() << "\n";
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", out_dir, "/config.json"));
  }
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<TensorSpec> specs = ExpectedTensors(config);
  (void)ForEachMtpTensor(config, [&](const TensorSpec& spec) {
    specs.push_back(spec);
    return absl::OkStatus();
  });
  // Each tensor as published, an FP8 projection followed by its scales.
  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& s : specs) {
    if (s.dtype == DType::kI8) {  // V4's MXFP4 expert: values of its logical [out][in]
      TensorSpec logical = s;
      logical.shape[1] *= 2;
      std::vector<float> scales;
      std::vector<float> bytes =
          QuantizeV4Fp4(RandomValues(logical, rng, normal, config), logical.shape[0], logical.shape[1], scales);
      const TensorSpec scale_spec = V4ScaleSpec(s, config);
      tensors.push_back({s.name, s.dtype, s.shape, std::move(bytes)});
      tensors.push_back({scale_spec.name, scale_spec.dtype, scale_spec.shape, std::move(scales)});
      continue;
    }
    std::vector<float> values = RandomValues(s, rng, normal, config);
    if (s.dtype != DType::kF8E4m3) {
      tensors.push_back({s.name, s.dtype, s.shape, std::move(values)});
      continue;
    }
    // V4's scales are E8M0 powers of two in "<name>.scale"; V3's F32.
    const bool v4 = config.v4.has_value();
    const TensorSpec scale_spec = v4 ? V4ScaleSpec(s, config) : ScaleSpec(s, *config.fp8);
    std::vector<float> scales;
    std::vector<float> codes = QuantizeFp8Blocks(values, s, scale_spec, *config.fp8, v4, scales);
    tensors.push_back({s.name, s.dtype, s.shape, std::move(codes)});
    tensors.push_back({scale_spec.name, scale_spec.dtype, scale_spec.shape, std::move(scales)});
  }
  std::vector<std::vector<TensorToWrite>> files(shards);
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < tensors.size(); ++i) {
    // A projection and its scales share a shard, as DeepSeek's do.
    const bool scales = absl::EndsWith(tensors[i].name, "_scale_inv") || absl::EndsWith(tensors[i].name, ".scale");
    const size_t shard = (scales ? i - 1 : i) * shards / tensors.size();
    weight_map[tensors[i].name] = ShardName(shard, shards);
    files[shard].push_back(std::move(tensors[i]));
  }
  if (shards == 1) return WriteSafetensors((fs::path(out_dir) / "model.safetensors").string(), files[0]);
  for (int k = 0; k < shards; ++k) {
    KVTIER_RETURN_IF_ERROR(WriteSafetensors((fs::path(out_dir) / ShardName(k, shards)).string(), files[k]));
  }
  std::ofstream index(fs::path(out_dir) / "model.safetensors.index.json");
  index << nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", weight_map}}.dump(2) << "\n";
  if (!index) return absl::UnavailableError(absl::StrCat("cannot write the index in ", out_dir));
  return absl::OkStatus();
}

}  // namespace kvtier::runtime
