// Parses sizes given on the command line: "1073741824", "512MiB", "4GiB",
// "64K" (K, M, G, T are binary multiples, with or without "iB"/"B").
#ifndef KVTIER_SERVICES_COMMON_BYTE_SIZE_H_
#define KVTIER_SERVICES_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvtier {

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);

// Physical memory of this machine in bytes.
uint64_t PhysicalMemoryBytes();

}  // namespace kvtier

#endif  // KVTIER_SERVICES_COMMON_BYTE_SIZE_H_
