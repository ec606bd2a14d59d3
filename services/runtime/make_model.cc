#include "services/runtime/make_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/common/status.h"
#include "services/runtime/safetensors.h"

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
  return absl::InvalidArgumentError(absl::StrCat("unknown preset '", preset, "' (tiny, lite-attn)"));
}

namespace {

// Hugging Face's shard file names: model-00001-of-00003.safetensors.
std::string ShardName(size_t index, int shards) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, shards);
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
  const std::vector<TensorSpec> specs = ExpectedTensors(config);
  std::vector<std::vector<TensorToWrite>> files(shards);
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& s = specs[i];
    TensorToWrite t{s.name, DType::kBf16, s.shape, {}};
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    t.values.resize(static_cast<size_t>(n));
    float stddev = 1.0f, mean = 0.0f;
    if (absl::EndsWith(s.name, "norm.weight")) {
      mean = 1.0f;
      stddev = 0.1f;
    } else if (s.shape.size() == 2 && s.name != "model.embed_tokens.weight") {
      stddev = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
      if (s.name == "lm_head.weight") stddev *= 4.0f;
    }
    for (float& v : t.values) v = mean + stddev * normal(rng);
    const size_t shard = i * shards / specs.size();
    weight_map[s.name] = ShardName(shard, shards);
    files[shard].push_back(std::move(t));
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
