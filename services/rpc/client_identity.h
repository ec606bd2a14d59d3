// How this process's channels reach kvtier servers: over TLS or plaintext
// (tls.h), and with which bearer token, if any, on every call (sent as
// `authorization: Bearer TOKEN`). Every channel a kvtier binary opens is
// made by MakeChannel, so one setting in main covers the cache client, the
// prefill node's calls to decode, and the CLI. Thread-safe; set it before
// the first channel is made.
#ifndef KVTIER_SERVICES_RPC_CLIENT_IDENTITY_H_
#define KVTIER_SERVICES_RPC_CLIENT_IDENTITY_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/rpc/tls.h"

namespace kvtier {

struct ClientIdentityOptions {
  TlsOptions tls;  // dir empty: plaintext
  // Empty: no token; else the file's first line, read again when it
  // changes (checked every tls.reload_seconds; token_file.h).
  std::string token_file;
};

// Sets the credentials and token of the channels made from now on.
// INVALID_ARGUMENT when a TLS file or the token file cannot be read, or
// the token file is empty.
absl::Status SetClientIdentity(const ClientIdentityOptions& options);

// Whether a channel shares the process's connection to its target (gRPC's
// global subchannel pool) or opens one of its own, for a caller that keeps
// many streams busy at once.
enum class Connection { kShared, kOwn };

// A channel to `target` with this process's identity and kvtier's channel
// settings: 64 MiB messages; a fixed 16 MiB stream window instead of
// gRPC's probing one, so megabyte blocks flow without waiting for window
// updates (load/README.md); and calls spread round robin over every address
// the target resolves to (a headless Service's pods) instead of all riding
// the first one's connection. Every channel to a kvtier server is made here.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, Connection connection = Connection::kShared);

// A channel to `target` with another identity (a tool or test acting as
// several tenants); errors as SetClientIdentity's.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannelAs(const ClientIdentityOptions& identity,
                                                             const std::string& target,
                                                             Connection connection = Connection::kShared);

// For a failed call's message: a hint when the server closed the connection
// in a way that, given this process's identity, likely means TLS was
// expected (no --tls-dir) or a client certificate was (none in it); else "".
std::string ConnectionHint(const absl::Status& status);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_CLIENT_IDENTITY_H_
