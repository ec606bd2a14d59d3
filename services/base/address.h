// Checks HOST:PORT addresses given on the command line, before anything
// is started: a server's to listen on, a client's to call.
#ifndef KVTIER_SERVICES_BASE_ADDRESS_H_
#define KVTIER_SERVICES_BASE_ADDRESS_H_

#include <string>

#include "absl/status/status.h"

namespace kvtier {

// "host:port" (IPv6 as "[::1]:port"), port 0-65535 (0: any free port).
absl::Status ValidateListenAddress(const std::string& address);
// "host:port" to call: a host, and a port 1-65535.
absl::Status ValidateTargetAddress(const std::string& address);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_ADDRESS_H_
