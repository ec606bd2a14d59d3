// How this process's channels reach kvtier servers: over TLS or plaintext
// (tls.h), and with which bearer token, if any, on every call (sent as
// `authorization: Bearer TOKEN`). Every channel a kvtier binary opens is
// made by MakeChannel, so one setting in main covers the cache client, the
// prefill node's calls to decode, and the CLI. Thread-safe; set it before
// the first channel is made.
#ifndef KVTIER_SERVICES_COMMON_CLIENT_IDENTITY_H_
#define KVTIER_SERVICES_COMMON_CLIENT_IDENTITY_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/common/tls.h"

namespace kvtier {

struct ClientIdentityOptions {
  TlsOptions tls;          // dir empty: plaintext
  std::string token_file;  // empty: no token; else the file's first line
};

// Sets the credentials and token of the channels made from now on.
// INVALID_ARGUMENT when a TLS file or the token file cannot be read, or
// the token file is empty.
absl::Status SetClientIdentity(const ClientIdentityOptions& options);

// A channel to `target` with this process's identity.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const grpc::ChannelArguments& args);

// A channel to `target` with another identity (a tool or test acting as
// several tenants); errors as SetClientIdentity's.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannelAs(const ClientIdentityOptions& identity,
                                                             const std::string& target,
                                                             const grpc::ChannelArguments& args = {});

}  // namespace kvtier

#endif  // KVTIER_SERVICES_COMMON_CLIENT_IDENTITY_H_
