// The conversions between absl::Status and gRPC's status, in one place
// each way; the numbering of both is google.rpc.Code.
#ifndef KVTIER_SERVICES_RPC_GRPC_STATUS_H_
#define KVTIER_SERVICES_RPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace kvtier {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// A gRPC code's name ("OK", "UNAVAILABLE"): the `code` label of every
// server's request metrics.
inline std::string StatusCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_GRPC_STATUS_H_
