// Sizes given on the command line, and how much memory this process may
// use.
#ifndef KVTIER_SERVICES_BASE_BYTE_SIZE_H_
#define KVTIER_SERVICES_BASE_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvtier {

// "1073741824", "512MiB", "4GiB", "4Gi" (as Kubernetes writes it),
// "1.5GiB", "4GB", "4G": with "i" or "iB", K, M, G and T are powers of 1024;
// bare or with "B", powers of 1000 (as Kubernetes and disk makers mean
// them). A fraction is rounded down to whole bytes.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);
// ParseByteSize for the value of --`flag`, whose error names the flag.
absl::StatusOr<uint64_t> ParseByteSizeFlag(const char* flag, const std::string& value);

// The memory this process may use: the machine's, or less where its
// cgroup (a container's memory limit) says so. `cgroup_root`: where the
// cgroup file system is mounted (v2's memory.max, or v1's
// memory/memory.limit_in_bytes).
struct MemoryLimit {
  uint64_t bytes = 0;
  bool from_cgroup = false;  // else the machine's physical memory
};
MemoryLimit ProcessMemoryLimit(const std::string& cgroup_root = "/sys/fs/cgroup");

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_BYTE_SIZE_H_
