// The caller of each call a kvtier server serves, found once per call: the
// server runner installs a CallerInterceptorFactory, which authenticates
// every call to a kvtier.v1 service as its headers arrive and keeps the
// answer with the call until it ends; handlers read it with CallerOf.
// Authenticating checks the client's certificate again against the TLS
// files in force (TlsFiles::CheckClient: gRPC checks it only at the
// handshake, and a connection outlives a revocation), then its
// credentials (TenantRegistry::Authenticate). Health checks and
// reflection need no credentials. Thread-safe.
#ifndef KVTIER_SERVICES_RPC_CALLER_H_
#define KVTIER_SERVICES_RPC_CALLER_H_

#include <grpcpp/support/server_interceptor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/rpc/tenants.h"
#include "services/rpc/tls_files.h"

namespace kvtier {

// How a server finds a call's caller: the files it checks it against
// (not owned; null: none) and the call's method, for the logs.
struct CallChecks {
  TenantRegistry* tenants = nullptr;
  TlsFiles* tls_files = nullptr;
  const char* method = nullptr;
};

class CallerInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `tenants` (not owned) says who may call; null: every caller, one trust
  // domain. `tls_files` (not owned): the server's; null for plaintext.
  CallerInterceptorFactory(TenantRegistry* tenants, TlsFiles* tls_files) : tenants_(tenants), tls_files_(tls_files) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override;

 private:
  TenantRegistry* const tenants_;
  TlsFiles* const tls_files_;
};

// The caller of the call `context` serves, or why it may not call
// (UNAUTHENTICATED, PERMISSION_DENIED, as Authenticate says). INTERNAL when
// no CallerInterceptorFactory saw the call (a server not built by the
// runner): a handler never serves a call nobody authenticated.
absl::StatusOr<std::shared_ptr<const Caller>> CallerOf(const grpc::ServerContextBase& context);

// A stream's caller, followed as it goes: a stream outlives the check its
// call got as it began, so once a reload has put other TLS files or
// another tenants file in force, its client is checked again against them
// as a new call would be. One stream's, used by one step at a time.
class FollowedCaller {
 public:
  // The caller of `context`'s call under the files in force: the same one
  // while neither changed since the last answer (two atomic reads), else
  // the client's certificate checked again and its credentials
  // authenticated again; or what a new call would get (UNAUTHENTICATED,
  // PERMISSION_DENIED). A caller other than the last answer's may have
  // other rights: the stream checks them again.
  absl::StatusOr<std::shared_ptr<const Caller>> Now(const grpc::ServerContextBase& context);

 private:
  CallChecks checks_;  // the call's, taken by the first Now
  std::shared_ptr<const Caller> caller_;
  uint64_t trust_version_ = 0;  // of the TLS files its client last passed; 0: none yet
};

// The certificate chain the client of `context` presented at its handshake
// (PEM: its certificate first, then what it sent with it); empty when it
// presented none (or the connection is plaintext).
std::string PeerCertificateChain(const grpc::ServerContextBase& context);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_CALLER_H_
