// Says why a listening address cannot be had: gRPC only says that it
// cannot.
#ifndef KVTIER_SERVICES_BASE_BIND_CHECK_H_
#define KVTIER_SERVICES_BASE_BIND_CHECK_H_

#include <string>

namespace kvtier {

// Why `address` (host:port, IPv6 as [::1]:port) cannot be bound now, as
// getaddrinfo(3) or bind(2) says it (e.g. "Address already in use").
std::string WhyCannotBind(const std::string& address);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_BIND_CHECK_H_
