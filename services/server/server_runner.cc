#include "services/server/server_runner.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <signal.h>

#include <iostream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/base/address.h"
#include "services/base/bind_check.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/rpc/caller.h"
#include "services/rpc/tls.h"
#include "services/rpc/tls_files.h"
#include "services/server/unparsed_request_interceptor.h"

namespace kvtier {
namespace {

// A call to a method this server does not have gets UNIMPLEMENTED saying
// which server it reached, where gRPC's own answer has no message: a client
// pointed at the wrong port learns what answered.
class UnknownMethods final : public grpc::CallbackGenericService {
 public:
  explicit UnknownMethods(std::string what) : what_(std::move(what)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    class Refusal final : public grpc::ServerGenericBidiReactor {
     public:
      explicit Refusal(const grpc::Status& status) { Finish(status); }
      void OnDone() override { delete this; }
    };
    return new Refusal(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                    absl::StrCat(context->method(), " is not served here: this is ", what_)));
  }

 private:
  const std::string what_;
};

constexpr absl::Duration kMostDrain = absl::Minutes(10);
constexpr absl::Duration kMostConnectionAge = absl::Hours(24 * 7);

// Reflection's plugin, once initialized, joins every server built in the
// process; the plaintext health port must serve health only.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const auto& plugin) { return plugin->name().find("reflection") != std::string::npos; });
  }
};

}  // namespace

void BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

ServerOptions ServerOptionsFor(const std::string& listen, const SecurityFlags& security) {
  ServerOptions options;
  options.listen = listen;
  options.tls = security.Tls();
  options.health_listen = security.health_listen;
  options.drain = security.Drain();
  options.max_connection_age = security.MaxConnectionAge();
  return options;
}

absl::Status ServerRunner::Check(const ServerOptions& options) {
  if (absl::Status s = ValidateListenAddress(options.listen); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--listen: ", s.message()));
  }
  if (!options.health_listen.empty()) {
    if (absl::Status s = ValidateListenAddress(options.health_listen); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--health-listen: ", s.message()));
    }
  }
  if (options.drain < absl::ZeroDuration() || options.drain > kMostDrain) {
    return absl::InvalidArgumentError(absl::StrCat("--drain-ms ", absl::ToInt64Milliseconds(options.drain),
                                                   ": must be 0 to ", absl::ToInt64Milliseconds(kMostDrain)));
  }
  if (options.max_connection_age < absl::ZeroDuration() || options.max_connection_age > kMostConnectionAge) {
    return absl::InvalidArgumentError(absl::StrCat("--max-connection-age-seconds ",
                                                   absl::ToInt64Seconds(options.max_connection_age), ": must be 0 to ",
                                                   absl::ToInt64Seconds(kMostConnectionAge), " (a week)"));
  }
  return ServerFiles(options.tls).status();
}

absl::StatusOr<std::unique_ptr<ServerRunner>> ServerRunner::Start(const ServerOptions& options,
                                                                  std::vector<grpc::Service*> services) {
  if (absl::Status s = Check(options); !s.ok()) return s;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = ServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  builder.AddListeningPort(options.listen, *credentials, &port);
  // gRPC sets SO_REUSEPORT by default: a second server on a port in use
  // would then share it with the first, each taking some connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Fixed per-stream receive window, as CacheClient sets (see there): large
  // streamed payloads flow without waiting for window updates. The resource
  // quota still bounds what all streams together may buffer.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20);
  // gRPC checks a client's certificate at the handshake only; the caller
  // interceptor checks it again at each call, and ending each connection
  // after an age makes a client of a dropped CA handshake again, refused.
  // Open calls keep gRPC's unbounded grace, so that they finish.
  if (options.max_connection_age > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               static_cast<int>(absl::ToInt64Milliseconds(options.max_connection_age)));
  }
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  KVTIER_ASSIGN_OR_RETURN(TlsFiles * tls_files, ServerFiles(options.tls));
  interceptors.push_back(std::make_unique<CallerInterceptorFactory>(options.tenants, tls_files));
  interceptors.push_back(std::make_unique<UnparsedRequestInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  grpc::ResourceQuota quota("kvtier");
  quota.Resize(static_cast<size_t>(options.memory_quota_bytes));
  builder.SetResourceQuota(quota);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::vector<std::unique_ptr<grpc::CallbackGenericService>> unknown;
  unknown.push_back(std::make_unique<UnknownMethods>(options.what));
  builder.RegisterCallbackGenericService(unknown.back().get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, ": ", WhyCannotBind(options.listen)));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  std::unique_ptr<grpc::Server> health;
  if (!options.health_listen.empty()) {
    // No service registered and no reflection: the default health service
    // is all it serves, and other methods are refused saying so.
    grpc::ServerBuilder health_builder;
    int health_port = 0;
    health_builder.AddListeningPort(options.health_listen, grpc::InsecureServerCredentials(), &health_port);
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    health_builder.SetOption(std::make_unique<WithoutReflection>());
    unknown.push_back(std::make_unique<UnknownMethods>(absl::StrCat("the plaintext health port of ",
                                                                    options.what.substr(0, options.what.find(',')),
                                                                    ", which serves grpc.health.v1.Health only")));
    health_builder.RegisterCallbackGenericService(unknown.back().get());
    health = health_builder.BuildAndStart();
    if (health == nullptr || health_port == 0) {
      server->Shutdown();
      return absl::UnavailableError(
          absl::StrCat("cannot serve health on ", options.health_listen, ": ", WhyCannotBind(options.health_listen)));
    }
    health->GetHealthCheckService()->SetServingStatus(true);
    std::cout << "health on " << options.health_listen.substr(0, options.health_listen.rfind(':')) << ":" << health_port
              << std::endl;
  }
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  std::cout << "listening on " << host << ":" << port << std::endl;
  if (!options.tls.dir.empty()) {
    Log(LogLevel::kInfo, "server",
        absl::StrCat("TLS from ", options.tls.dir,
                     options.tls.require_client_certificate ? ", client certificates required" : ""));
  }
  // Once serving, so that a flag's error is not preceded by it.
  if (options.tenants == nullptr || !options.tenants->enforced()) {
    Log(LogLevel::kWarning, "auth",
        "no --tenants file: every caller is trusted with every namespace (one trust domain)");
  }
  return std::unique_ptr<ServerRunner>(new ServerRunner(std::move(unknown), std::move(server), std::move(health), port,
                                                        options.shutdown_grace, options.drain));
}

ServerRunner::~ServerRunner() { Shutdown(); }

int WaitForStopSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int signal = 0;
  sigwait(&set, &signal);
  return signal;
}

void ServerRunner::WaitForShutdownSignal() {
  const int signal = WaitForStopSignal();
  Log(LogLevel::kInfo, "",
      absl::StrCat("received ", signal == SIGTERM ? "SIGTERM" : "SIGINT", ": draining in-flight RPCs"));
  SetServing(false);
  absl::SleepFor(drain_);
  Shutdown();
}

void ServerRunner::SetServing(bool serving) {
  server_->GetHealthCheckService()->SetServingStatus(serving);
  if (health_ != nullptr) health_->GetHealthCheckService()->SetServingStatus(serving);
}

void ServerRunner::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  SetServing(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace_));
  server_->Wait();
  if (health_ != nullptr) health_->Shutdown();
}

}  // namespace kvtier
