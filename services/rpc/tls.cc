#include "services/rpc/tls.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "services/base/status.h"
#include "services/rpc/tls_files.h"

namespace kvtier {
namespace {

// gRPC reads the checked copies (tls_files.h) often: they are in memory,
// and only change when a whole new set has been checked.
constexpr unsigned kCopiesReadSeconds = 1;

absl::Duration Reload(const TlsOptions& options) { return absl::Seconds(options.reload_seconds); }

// gRPC's watcher of the checked copies: the key and chain (in one file)
// when there is an identity, and the CA bundle.
std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> CopiesProvider(const TlsFiles& files) {
  if (!files.has_identity()) {
    return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(files.ca_path(), kCopiesReadSeconds);
  }
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.identity_path(), files.identity_path(), files.ca_path(), kCopiesReadSeconds);
}

}  // namespace

absl::StatusOr<TlsFiles*> ServerFiles(const TlsOptions& options) {
  if (options.dir.empty()) return nullptr;
  return TlsFiles::Shared(options.dir, /*need_identity=*/true, Reload(options));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsOptions& options) {
  if (options.dir.empty()) return grpc::InsecureServerCredentials();
  KVTIER_ASSIGN_OR_RETURN(TlsFiles * files, ServerFiles(options));
  grpc::experimental::TlsServerCredentialsOptions tls(CopiesProvider(*files));
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_crl_directory(files->crl_dir());
  tls.set_cert_request_type(options.require_client_certificate
                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(tls);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const TlsOptions& options) {
  if (options.dir.empty()) return grpc::InsecureChannelCredentials();
  KVTIER_ASSIGN_OR_RETURN(TlsFiles * files, TlsFiles::Shared(options.dir, /*need_identity=*/false, Reload(options)));
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(CopiesProvider(*files));
  tls.watch_root_certs();
  if (files->has_identity()) tls.watch_identity_key_cert_pairs();
  tls.set_crl_directory(files->crl_dir());
  return grpc::experimental::TlsCredentials(tls);
}

bool ChannelPresentsCertificate(const TlsOptions& options) {
  if (options.dir.empty()) return false;
  absl::StatusOr<TlsFiles*> files = TlsFiles::Shared(options.dir, /*need_identity=*/false, Reload(options));
  return files.ok() && (*files)->has_identity();
}

}  // namespace kvtier
