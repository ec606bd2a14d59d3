// The security flags every kvtier binary takes, with the same names and
// meaning everywhere: --tls-dir (a Kubernetes TLS Secret's files),
// --tls-require-client-cert (servers: mutual TLS), --token-file (the
// bearer token this process's calls carry), --tenants (servers: who may
// call), --reload-seconds (how often those files are checked), and what
// kubelet's probes read: --health-listen (servers: plaintext health) and
// --drain-ms (servers: NOT_SERVING for a while before the port closes);
// --max-connection-age-seconds (servers: a client's certificate checked
// again on a new connection after it).
#ifndef KVTIER_SERVICES_RPC_SECURITY_FLAGS_H_
#define KVTIER_SERVICES_RPC_SECURITY_FLAGS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/base/flags.h"
#include "services/rpc/tenants.h"
#include "services/rpc/tls.h"

namespace kvtier {

struct SecurityFlags {
  std::string tls_dir;
  bool tls_require_client_cert = false;
  std::string token_file;
  std::string tenants;
  uint64_t reload_seconds = 10;
  std::string health_listen;
  uint64_t drain_ms = 1000;
  uint64_t max_connection_age_seconds = 600;

  // Registers the flags of a process that `serves` gRPC, `calls` servers,
  // or both.
  void Register(FlagParser& flags, bool serves, bool calls);
  TlsOptions Tls() const;
  absl::Duration Drain() const { return absl::Milliseconds(static_cast<int64_t>(drain_ms)); }
  absl::Duration MaxConnectionAge() const { return absl::Seconds(static_cast<int64_t>(max_connection_age_seconds)); }
  // Sets this process's client identity (client_identity.h) from them.
  absl::Status ApplyToClients() const;
  // The tenant registry of a server.
  absl::StatusOr<std::unique_ptr<TenantRegistry>> OpenTenants() const;

 private:
  static constexpr uint64_t kMostReloadSeconds = 86400;
  // INVALID_ARGUMENT unless --reload-seconds is in range (0 would check
  // the files in a busy loop).
  absl::Status CheckReload() const;
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_SECURITY_FLAGS_H_
