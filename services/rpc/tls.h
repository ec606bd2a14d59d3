// TLS for kvtier's gRPC servers and channels, from a directory laid out as
// a Kubernetes TLS Secret (what cert-manager writes): ca.crt, the CA that
// signs peers' certificates; tls.crt, this process's certificate chain;
// tls.key, its private key. They are read again when they change, so a
// rotated certificate is used by new connections without a restart; a
// version that is not whole is refused and the last good one kept
// (tls_files.h). gRPC's own TLS serves them.
#ifndef KVTIER_SERVICES_RPC_TLS_H_
#define KVTIER_SERVICES_RPC_TLS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvtier {

class TlsFiles;

struct TlsOptions {
  std::string dir;  // empty: plaintext
  // Server: refuse a client without a certificate signed by ca.crt (one
  // that presents a certificate is verified either way).
  bool require_client_certificate = false;
  // How often the files are checked for changes.
  unsigned reload_seconds = 10;
};

// The files ServerCredentials(options) serves, read (once a process) and
// checked (TlsFiles::Shared); null for plaintext, else INVALID_ARGUMENT as
// ServerCredentials says it.
absl::StatusOr<TlsFiles*> ServerFiles(const TlsOptions& options);

// Credentials for a server: plaintext when options.dir is empty.
// INVALID_ARGUMENT naming the file when one is missing, unreadable or not
// whole (a key that is not the certificate's included).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsOptions& options);

// Credentials for a channel: trusts ca.crt and presents tls.crt when the
// directory has it (mutual TLS); plaintext when options.dir is empty.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const TlsOptions& options);

// Whether ChannelCredentials(options) presents a certificate (tls.crt and
// tls.key were there when the directory was first read).
bool ChannelPresentsCertificate(const TlsOptions& options);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_TLS_H_
