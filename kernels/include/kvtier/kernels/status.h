// A minimal status type for kernels/.
//
// kernels/ must build where only a compiler (and nvcc) exist, so it cannot
// depend on Abseil. The codes use absl::StatusCode's numbering, and
// services/base/status.h converts to absl::Status in one place.
#ifndef KVTIER_KERNELS_STATUS_H_
#define KVTIER_KERNELS_STATUS_H_

#include <string>
#include <utility>

namespace kvtier::kernels {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 3,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
};

// Value type; not thread-safe to mutate, safe to copy between threads.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgument(std::string message) { return Status(StatusCode::kInvalidArgument, std::move(message)); }

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_STATUS_H_
