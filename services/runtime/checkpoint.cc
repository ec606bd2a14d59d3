#include "services/runtime/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/common/status.h"
#include "services/runtime/tokenizer.h"

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
    KVTIER_ASSIGN_OR_RETURN(const std::string index_text, ReadText(index_path));
    const nlohmann::json index = nlohmann::json::parse(index_text, nullptr, false);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), " has no weight_map object"));
    }
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path.string(), ": weight_map entry for ", name, " is not a file name"));
      }
      location[name] = file.get<std::string>();
    }
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

  KVTIER_RETURN_IF_ERROR(ForEachExpectedTensor(ckpt->config_, [&](const TensorSpec& spec) -> absl::Status {
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
    ckpt->tensors_.emplace(spec.name, *view);
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
