// Reading a file that an operator (or Kubernetes, for a mounted Secret)
// replaces while the process runs.
#ifndef KVTIER_SERVICES_BASE_WATCHED_FILE_H_
#define KVTIER_SERVICES_BASE_WATCHED_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace kvtier {

// The file's inode, size and modification time: what changes when it is
// rewritten or replaced by a rename. Empty when it cannot be read.
std::string FileSignature(const std::string& path);

// The whole file; INVALID_ARGUMENT "cannot read PATH: why" when it cannot
// be read.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_WATCHED_FILE_H_
