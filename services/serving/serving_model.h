// A checkpoint loaded for serving: the model and the id its blocks' keys
// carry. What kvtier-prefill and kvtier-decode load at start-up.
#ifndef KVTIER_SERVICES_SERVING_SERVING_MODEL_H_
#define KVTIER_SERVICES_SERVING_SERVING_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/runtime/model.h"

namespace kvtier::serving {

// The weights are copied into the model at load, so the checkpoint's
// mapping is released once loaded.
struct ServingModel {
  std::unique_ptr<runtime::Model> model;
  std::string id;  // ModelId(dir)
};

absl::StatusOr<ServingModel> LoadServingModel(const std::string& dir);

}  // namespace kvtier::serving

#endif  // KVTIER_SERVICES_SERVING_SERVING_MODEL_H_
