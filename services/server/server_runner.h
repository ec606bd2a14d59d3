// Runs a gRPC server the way every kvtier service runs: each call's caller
// authenticated once, before its handler (services/rpc/caller.h); health and
// reflection, deliberate message-size and memory limits, `listening on
// HOST:PORT` on stdout once bound, and a graceful stop on SIGTERM or SIGINT
// (health NOT_SERVING, in-flight RPCs finish within a grace period, exit).
#ifndef KVTIER_SERVICES_SERVER_SERVER_RUNNER_H_
#define KVTIER_SERVICES_SERVER_SERVER_RUNNER_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/rpc/security_flags.h"
#include "services/rpc/tenants.h"
#include "services/rpc/tls.h"

namespace kvtier {

struct ServerOptions {
  std::string listen;  // host:port; port 0 picks a free one
  int max_message_bytes = 64 << 20;
  // gRPC's own buffers (resource quota); requests beyond it are refused.
  int64_t memory_quota_bytes = 1LL << 30;
  absl::Duration shutdown_grace = absl::Seconds(30);
  // After a stop signal, how long health says NOT_SERVING while calls are
  // still taken, so that probes and load balancers see it before the port
  // closes.
  absl::Duration drain = absl::Seconds(1);
  // After how long a connection is asked to close (GOAWAY): the client's
  // next calls go over a new connection, whose handshake checks its
  // certificate against the TLS files then in force, while calls already
  // open finish. Zero: never.
  absl::Duration max_connection_age = absl::ZeroDuration();
  TlsOptions tls;  // dir empty: plaintext
  // Who may call (not owned; it must outlive the server); null: every
  // caller, one trust domain.
  TenantRegistry* tenants = nullptr;
  // A plaintext port serving only grpc.health.v1 (kubelet's gRPC probes
  // speak no TLS); empty: none.
  std::string health_listen;
  // What this server is, for a call to a method it does not serve
  // ("kvtier-cache, which serves kvtier.v1.KvCache").
  std::string what = "this kvtier server";
};

// The server --listen and the security flags describe: its address, TLS,
// plaintext health port and drain. Who may call it and what it serves are
// the caller's to set.
ServerOptions ServerOptionsFor(const std::string& listen, const SecurityFlags& security);

// Blocks SIGTERM and SIGINT in this thread and every thread it creates, so
// that WaitForShutdownSignal receives them. Call first thing in main.
void BlockShutdownSignals();

// Waits for SIGTERM or SIGINT (blocked by BlockShutdownSignals); returns it.
int WaitForStopSignal();

class ServerRunner {
 public:
  // INVALID_ARGUMENT for what Start refuses before it binds: an address
  // that is not HOST:PORT, --drain-ms or --max-connection-age-seconds out
  // of range, a --tls-dir that is not a whole set of files. A process
  // calls it before slow work (loading a model, opening a disk tier), so
  // that a mistake is said at once.
  static absl::Status Check(const ServerOptions& options);
  // Builds and starts the server with `services` (not owned; they must
  // outlive it). Prints "health on HOST:PORT" (with health_listen), then
  // "listening on HOST:PORT".
  static absl::StatusOr<std::unique_ptr<ServerRunner>> Start(const ServerOptions& options,
                                                             std::vector<grpc::Service*> services);
  ~ServerRunner();

  int port() const { return port_; }
  // Waits for SIGTERM or SIGINT, drains (health NOT_SERVING, calls still
  // taken), then stops gracefully.
  void WaitForShutdownSignal();
  // Health to NOT_SERVING, then waits up to the grace period for in-flight
  // RPCs and cancels what is left.
  void Shutdown();

 private:
  ServerRunner(std::vector<std::unique_ptr<grpc::CallbackGenericService>> unknown, std::unique_ptr<grpc::Server> server,
               std::unique_ptr<grpc::Server> health, int port, absl::Duration grace, absl::Duration drain)
      : unknown_(std::move(unknown)),
        server_(std::move(server)),
        health_(std::move(health)),
        port_(port),
        grace_(grace),
        drain_(drain) {}
  void SetServing(bool serving);

  // Answer calls to methods the servers do not have (server_runner.cc).
  std::vector<std::unique_ptr<grpc::CallbackGenericService>> unknown_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> health_;  // null without health_listen
  int port_;
  absl::Duration grace_;
  absl::Duration drain_;
  bool shut_down_ = false;
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_SERVER_SERVER_RUNNER_H_
