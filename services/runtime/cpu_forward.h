// Model's forward pass on the CPU (--device cpu): weights in host memory
// as the checkpoint stores them (projections bf16, FP8 with block scales or
// float32, read as such by the kernels' products), each sequence's rows
// attending in the cheaper of the absorbed and expanded forms
// (kernels::MlaFormCosts). A sequence's results do not depend on what else
// is in the batch, bit for bit.
#ifndef KVTIER_SERVICES_RUNTIME_CPU_FORWARD_H_
#define KVTIER_SERVICES_RUNTIME_CPU_FORWARD_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kvtier/kernels/rope.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/model.h"

namespace kvtier::runtime {

// Loads the checkpoint's weights into host memory.
absl::StatusOr<std::unique_ptr<ForwardBackend>> LoadCpuForward(const Checkpoint& checkpoint,
                                                               const kernels::RopeTable& rope);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_CPU_FORWARD_H_
