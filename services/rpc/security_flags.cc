#include "services/rpc/security_flags.h"

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
#include "services/rpc/client_identity.h"

namespace kvtier {

void SecurityFlags::Register(FlagParser& flags, bool serves, bool calls) {
  flags.AddString("tls-dir", &tls_dir,
                  "TLS for every gRPC call: a directory with ca.crt, tls.crt and tls.key (a Kubernetes TLS "
                  "Secret; a client needs only ca.crt, and presents tls.crt when it has one), and ca.crl, its "
                  "CAs' revocation lists, if any; reloaded when they change. Empty: plaintext");
  flags.AddUint("reload-seconds", &reload_seconds,
                "how often the TLS files and the tenants file are checked (1 to 86400)");
  if (calls) {
    flags.AddString("token-file", &token_file,
                    "a file whose first line is the bearer token this process's calls carry (to servers run "
                    "with --tenants); read again when it changes, the last good token kept if it becomes "
                    "unreadable or empty");
  }
  if (!serves) return;
  flags.AddString("health-listen", &health_listen,
                  "HOST:PORT of a plaintext server of grpc.health.v1 only, for probes that speak no TLS "
                  "(kubelet's gRPC probes); empty: none");
  flags.AddUint("drain-ms", &drain_ms,
                "after SIGTERM, how long health says NOT_SERVING while calls are still served, so that probes "
                "and load balancers see it before the port closes (0 to 600000)");
  flags.AddUint("max-connection-age-seconds", &max_connection_age_seconds,
                "after how long a client's connection is asked to close (a GOAWAY; its calls go on over "
                "a new connection, its open streams finish), so that a client whose certificate or CA is no "
                "longer trusted, whose calls are refused already, handshakes again, refused; 0: never "
                "(0 to 604800)");
  flags.AddBool("tls-require-client-cert", &tls_require_client_cert,
                "mutual TLS: refuse clients without a certificate signed by ca.crt");
  flags.AddString("tenants", &tenants,
                  "the tenants file (JSON, proto/kvtier/v1/tenants.proto): who may call, in which namespaces, "
                  "with which role; reloaded when it changes. Empty: every caller is trusted");
}

TlsOptions SecurityFlags::Tls() const {
  return {.dir = tls_dir,
          .require_client_certificate = tls_require_client_cert,
          .reload_seconds = static_cast<unsigned>(reload_seconds)};
}

absl::Status SecurityFlags::CheckReload() const {
  if (reload_seconds < 1 || reload_seconds > kMostReloadSeconds) {
    return absl::InvalidArgumentError(
        absl::StrCat("--reload-seconds ", reload_seconds, ": must be 1 to ", kMostReloadSeconds, " (a day)"));
  }
  return absl::OkStatus();
}

absl::Status SecurityFlags::ApplyToClients() const {
  KVTIER_RETURN_IF_ERROR(CheckReload());
  return SetClientIdentity({.tls = Tls(), .token_file = token_file});
}

absl::StatusOr<std::unique_ptr<TenantRegistry>> SecurityFlags::OpenTenants() const {
  KVTIER_RETURN_IF_ERROR(CheckReload());
  return TenantRegistry::Open(tenants, absl::Seconds(static_cast<int64_t>(reload_seconds)));
}

}  // namespace kvtier
