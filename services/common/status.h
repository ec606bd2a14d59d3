// Status helpers shared by every service: the early-return macros Abseil
// 20220623 lacks, the one conversion from kernels' status, and the one
// conversion to gRPC's.
#ifndef KVTIER_SERVICES_COMMON_STATUS_H_
#define KVTIER_SERVICES_COMMON_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/kernels/status.h"

#define KVTIER_STATUS_CONCAT_INNER_(a, b) a##b
#define KVTIER_STATUS_CONCAT_(a, b) KVTIER_STATUS_CONCAT_INNER_(a, b)

// Returns `expr` (an absl::Status) from the current function unless it is OK.
#define KVTIER_RETURN_IF_ERROR(expr)                                  \
  do {                                                                \
    if (absl::Status kvtier_status_ = (expr); !kvtier_status_.ok()) { \
      return kvtier_status_;                                          \
    }                                                                 \
  } while (0)

// `lhs = value of (expr)`, an absl::StatusOr<T>, or returns its error.
#define KVTIER_ASSIGN_OR_RETURN(lhs, expr) \
  KVTIER_ASSIGN_OR_RETURN_IMPL_(KVTIER_STATUS_CONCAT_(kvtier_statusor_, __LINE__), lhs, expr)
#define KVTIER_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace kvtier {

// kernels::StatusCode uses absl::StatusCode's numbering.
inline absl::Status FromKernelStatus(const kernels::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.code()), s.message());
}

// The one place an absl::Status becomes a gRPC status; the numbering of both
// is google.rpc.Code.
inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// A gRPC code's name ("OK", "UNAVAILABLE"): the `code` label of every
// server's request metrics.
inline std::string StatusCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace kvtier

#endif  // KVTIER_SERVICES_COMMON_STATUS_H_
