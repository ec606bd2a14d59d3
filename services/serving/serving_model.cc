#include "services/serving/serving_model.h"

#include "services/common/status.h"
#include "services/runtime/checkpoint.h"
#include "services/serving/sequence_blocks.h"

namespace kvtier::serving {

absl::StatusOr<ServingModel> LoadServingModel(const std::string& dir) {
  ServingModel m;
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Checkpoint> checkpoint, runtime::Checkpoint::Open(dir));
  KVTIER_ASSIGN_OR_RETURN(m.model, runtime::Model::Load(*checkpoint));
  KVTIER_ASSIGN_OR_RETURN(m.id, ModelId(dir));
  return m;
}

}  // namespace kvtier::serving
