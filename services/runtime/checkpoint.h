// A Hugging Face checkpoint directory of a DeepSeek-V2 or V3-family model:
// config.json plus model.safetensors, or shards listed by
// model.safetensors.index.json, and optionally tokenizer_config.json. Open
// checks that every tensor the config implies is present with its shape
// and a dtype it may have (an FP8 projection with its block scales), so
// later code can take them without re-checking. Immutable; thread-safe.
#ifndef KVTIER_SERVICES_RUNTIME_CHECKPOINT_H_
#define KVTIER_SERVICES_RUNTIME_CHECKPOINT_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/runtime/model_config.h"
#include "services/runtime/safetensors.h"

namespace kvtier::runtime {

class Checkpoint {
 public:
  // Errors name the file, field or tensor: NOT_FOUND for a missing
  // config.json or weights file (a shard the index names); INVALID_ARGUMENT
  // for a malformed one (an unknown dtype among them), a tensor listed twice
  // in the index, a missing tensor, a wrong shape, an FP8 tensor that may
  // not be one or lacks quantization_config, a missing or misshapen block
  // scale tensor; UNIMPLEMENTED for unsupported settings. Logs one line
  // when it skips MTP layers.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const ModelConfig& config() const { return config_; }
  // tokenizer_config.json's tokenizer_class; empty when there is none.
  const std::string& tokenizer_class() const { return tokenizer_class_; }
  const std::string& dir() const { return dir_; }
  // A tensor Open verified (an FP8 projection's scales too, by ScaleSpec's
  // name); NOT_FOUND for a name the config does not imply.
  absl::StatusOr<TensorView> Tensor(const std::string& name) const;

 private:
  Checkpoint() = default;

  std::string dir_;
  ModelConfig config_;
  std::string tokenizer_class_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_CHECKPOINT_H_
