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

// The host of a gRPC peer string, without its port: "ipv4:10.0.0.7:5123"
// gives "10.0.0.7", "ipv6:[::1]:5123" gives "::1"; anything else (a unix
// socket's peer) as it is.
std::string PeerHost(const std::string& peer);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_ADDRESS_H_
