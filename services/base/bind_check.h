// Listening addresses resolved, and why one cannot be had: gRPC only says
// that it cannot.
#ifndef KVTIER_SERVICES_BASE_BIND_CHECK_H_
#define KVTIER_SERVICES_BASE_BIND_CHECK_H_

#include <netdb.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvtier {

using AddressList = std::unique_ptr<addrinfo, void (*)(addrinfo*)>;

// What `address` (host:port, IPv6 as [::1]:port, no host: every interface)
// names to listen on, as getaddrinfo(3) resolves it; INVALID_ARGUMENT when
// it is not HOST:PORT (port 0-65535), UNAVAILABLE with getaddrinfo's reason
// when it does not resolve.
absl::StatusOr<AddressList> ListenAddresses(const std::string& address);

// Why `address` cannot be bound now, as getaddrinfo(3) or bind(2) says it
// (e.g. "Address already in use").
std::string WhyCannotBind(const std::string& address);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_BIND_CHECK_H_
