// Status helpers for every layer: the early-return macros Abseil 20220623
// lacks and the one conversion from kernels' status. No gRPC here: its
// conversions are in services/rpc/grpc_status.h.
#ifndef KVTIER_SERVICES_BASE_STATUS_H_
#define KVTIER_SERVICES_BASE_STATUS_H_

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

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_STATUS_H_
