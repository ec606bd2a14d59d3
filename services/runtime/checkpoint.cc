#include "services/runtime/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/runtime/model_tensors.h"
#include "services/runtime/tokenizer.h"
#include "services/runtime/v4_tensors.h"

namespace kvtier::runtime {
namespace fs = std::filesystem;
namespace {

absl::StatusOr<std::string> ReadText(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string ShapeText(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

// The index's weight_map (tensor -> file name). A tensor listed twice is an
// error: which file holds it would depend on the JSON reader.
absl::StatusOr<std::map<std::string, std::string>> ReadWeightMap(const fs::path& index_path) {
  KVTIER_ASSIGN_OR_RETURN(const std::string index_text, ReadText(index_path));
  std::string top_key, duplicate;
  std::set<std::string> listed;
  const nlohmann::json::parser_callback_t note_keys = [&](int depth, nlohmann::json::parse_event_t event,
                                                          nlohmann::json& parsed) {
    if (event != nlohmann::json::parse_event_t::key) return true;
    if (depth == 1) top_key = parsed.get<std::string>();
    if (depth == 2 && top_key == "weight_map" && !listed.insert(parsed.get<std::string>()).second &&
        duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  const nlohmann::json index = nlohmann::json::parse(index_text, note_keys, false);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path.string(), " has no weight_map object"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path.string(), " lists tensor ", duplicate, " twice in its weight_map"));
  }
  std::map<std::string, std::string> location;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": weight_map entry for ", name, " is not a file name"));
    }
    location[name] = file.get<std::string>();
  }
  return location;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;
  KVTIER_ASSIGN_OR_RETURN(const std::string config_text, ReadText(fs::path(dir) / "config.json"));
  absl::StatusOr<ModelConfig> config = ParseModelConfig(config_text);
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(dir, "/", config.status().message()));
  }
  ckpt->config_ = *config;
  // Optional: without it the checkpoint names no tokenizer.
  if (const fs::path tokenizer = fs::path(dir) / "tokenizer_config.json"; fs::exists(tokenizer)) {
    KVTIER_ASSIGN_OR_RETURN(const std::string tokenizer_text, ReadText(tokenizer));
    absl::StatusOr<std::string> tokenizer_class = ParseTokenizerClass(tokenizer_text);
    if (!tokenizer_class.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(tokenizer.string(), ": ", tokenizer_class.status().message()));
    }
    ckpt->tokenizer_class_ = *std::move(tokenizer_class);
  }

  // Where each tensor lives: the index's weight_map, or the single file.
  std::map<std::string, std::string> location;  // tensor -> file name
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    KVTIER_ASSIGN_OR_RETURN(location, ReadWeightMap(index_path));
  }
  const ModelConfig& c = ckpt->config_;
  if (c.num_nextn_predict_layers > 0) {
    Log(LogLevel::kInfo, "checkpoint",
        absl::StrCat(
            dir, ": skipping its ", c.num_nextn_predict_layers, " multi-token prediction layer(s) (",
            c.v4.has_value() ? std::string("mtp.*") : absl::StrCat("model.layers.", c.num_hidden_layers, ".* on"),
            "): they serve speculative decoding, which kvtier does not run"));
  }
  std::map<std::string, SafetensorsFile*> opened;
  auto file_for = [&](const std::string& name) -> absl::StatusOr<SafetensorsFile*> {
    auto it = opened.find(name);
    if (it != opened.end()) return it->second;
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                            SafetensorsFile::Open((fs::path(dir) / name).string()));
    ckpt->files_.push_back(std::move(file));
    return opened[name] = ckpt->files_.back().get();
  };

  // A tensor of `spec`'s name and shape, from the file the index names.
  auto find = [&](const TensorSpec& spec) -> absl::StatusOr<TensorView> {
    const auto listed = location.find(spec.name);
    const std::string file_name = location.empty()           ? "model.safetensors"
                                  : listed == location.end() ? ""
                                                             : listed->second;
    if (file_name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), " does not list tensor ", spec.name));
    }
    KVTIER_ASSIGN_OR_RETURN(SafetensorsFile * file, file_for(file_name));
    absl::StatusOr<TensorView> view = file->Tensor(spec.name);
    if (!view.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", dir, " lacks tensor ", spec.name, " (looked in ", file_name, ")"));
    }
    if (view->shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", spec.name, " has shape ", ShapeText(view->shape),
                                                     ", config.json implies ", ShapeText(spec.shape)));
    }
    return view;
  };
  KVTIER_RETURN_IF_ERROR(ForEachExpectedTensor(c, [&](const TensorSpec& spec) -> absl::Status {
    KVTIER_ASSIGN_OR_RETURN(const TensorView view, find(spec));
    ckpt->tensors_.emplace(spec.name, view);
    if (view.dtype != DType::kF8E4m3 && view.dtype != DType::kI8) return absl::OkStatus();
    // FP8 (or DeepSeek-V4's FP4 experts, I8 bytes): a projection, with the
    // block scales config.json's quantization implies (a bf16 cast of an
    // FP8 checkpoint has neither).
    if (!spec.projection || (view.dtype == DType::kI8) != (spec.dtype == DType::kI8)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", spec.name, " is ", DTypeName(view.dtype),
                                                     ", but only projections may be stored in FP8 (and DeepSeek-V4's "
                                                     "routed experts in FP4, as I8)"));
    }
    if (!c.fp8.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", spec.name,
                                                     " is F8_E4M3, but config.json has no quantization_config to "
                                                     "give its block size"));
    }
    const TensorSpec scale_spec = c.v4.has_value() ? V4ScaleSpec(spec, c) : ScaleSpec(spec, *c.fp8);
    KVTIER_ASSIGN_OR_RETURN(const TensorView scale, find(scale_spec));
    // DeepSeek-V4 publishes its scales as E8M0 (or F32); the V3 family as F32.
    if (scale.dtype != DType::kF32 && !(c.v4.has_value() && scale.dtype == DType::kF8E8m0)) {
      return absl::InvalidArgumentError(absl::StrCat("block scale tensor ", scale_spec.name, " is ",
                                                     DTypeName(scale.dtype),
                                                     c.v4.has_value() ? ", not F8_E8M0 or F32" : ", not F32"));
    }
    ckpt->tensors_.emplace(scale_spec.name, scale);
    return absl::OkStatus();
  }));
  return ckpt;
}

absl::StatusOr<TensorView> Checkpoint::Tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor ", name, " is not part of this model"));
  }
  return it->second;
}

}  // namespace kvtier::runtime
