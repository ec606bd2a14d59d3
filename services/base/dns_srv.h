// DNS SRV look-ups through the C library's resolver (libresolv): how
// kvtier finds the pods behind a Kubernetes headless Service, which
// publishes one SRV record per ready pod.
#ifndef KVTIER_SERVICES_BASE_DNS_SRV_H_
#define KVTIER_SERVICES_BASE_DNS_SRV_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier {

struct SrvRecord {
  std::string host;  // without the trailing dot
  uint16_t port = 0;
  uint16_t priority = 0;
  uint16_t weight = 0;
};

// INVALID_ARGUMENT unless `dns_server` is empty or "IPv4:PORT".
absl::Status ValidateDnsServer(const std::string& dns_server);

// The SRV records of `name`, looked up as the C library looks up any name:
// a name ending in '.' as it is, others also under the search domains of
// /etc/resolv.conf (in a Kubernetes pod, its namespace's first, so
// "_grpc._tcp.kvtier-cache" finds the Service in the pod's own namespace).
// `dns_server`: "IPv4:PORT" to ask, or empty for the system's resolvers. A
// name that does not exist or has no SRV records gives an empty list: that
// is an answer. UNAVAILABLE when no server answered or one failed
// (SERVFAIL); INVALID_ARGUMENT for a bad `dns_server`.
absl::StatusOr<std::vector<SrvRecord>> LookUpSrv(const std::string& name, const std::string& dns_server);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_DNS_SRV_H_
