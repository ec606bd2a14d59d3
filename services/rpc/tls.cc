#include "services/rpc/tls.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

std::string InDir(const std::string& dir, const char* name) { return absl::StrCat(dir, "/", name); }

absl::Status Readable(const std::string& path) {
  if (access(path.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-dir: cannot read ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsOptions& options) {
  if (options.dir.empty()) return grpc::InsecureServerCredentials();
  const std::string ca = InDir(options.dir, "ca.crt"), cert = InDir(options.dir, "tls.crt"),
                    key = InDir(options.dir, "tls.key");
  for (const std::string& path : {ca, cert, key}) {
    if (absl::Status s = Readable(path); !s.ok()) return s;
  }
  auto provider =
      std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(key, cert, ca, options.reload_seconds);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_cert_request_type(options.require_client_certificate
                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(tls);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const TlsOptions& options) {
  if (options.dir.empty()) return grpc::InsecureChannelCredentials();
  const std::string ca = InDir(options.dir, "ca.crt"), cert = InDir(options.dir, "tls.crt"),
                    key = InDir(options.dir, "tls.key");
  if (absl::Status s = Readable(ca); !s.ok()) return s;
  const bool identity = access(cert.c_str(), R_OK) == 0 && access(key.c_str(), R_OK) == 0;
  auto provider =
      identity
          ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(key, cert, ca, options.reload_seconds)
          : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(ca, options.reload_seconds);
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(provider);
  tls.watch_root_certs();
  if (identity) tls.watch_identity_key_cert_pairs();
  return grpc::experimental::TlsCredentials(tls);
}

}  // namespace kvtier
