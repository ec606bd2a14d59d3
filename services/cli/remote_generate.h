// A generation through a prefill node (kvtier.v1.Prefill/Generate), and its
// Info, for `kvtier generate`, `kvtier up` and the fidelity benchmark.
#ifndef KVTIER_SERVICES_CLI_REMOTE_GENERATE_H_
#define KVTIER_SERVICES_CLI_REMOTE_GENERATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/v1/prefill.pb.h"
#include "services/runtime/sampler.h"

namespace kvtier::cli {

struct RemoteGeneration {
  std::vector<runtime::Sampled> tokens;
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
  v1::Usage usage;
};

// Runs `request` on the prefill node at `target` to the end. The call's
// error (with its gRPC code) when it fails.
absl::StatusOr<RemoteGeneration> GenerateRemotely(const std::string& target, const v1::GenerateRequest& request,
                                                  absl::Duration deadline);

// The prefill node's Info: its model, vocabulary and tokenizer.
absl::StatusOr<v1::ServerInfo> PrefillInfo(const std::string& target, absl::Duration deadline);

}  // namespace kvtier::cli

#endif  // KVTIER_SERVICES_CLI_REMOTE_GENERATE_H_
