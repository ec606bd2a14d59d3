#include "services/rpc/client_identity.h"

#include <grpcpp/support/client_interceptor.h>

#include <utility>
#include <vector>

#include "absl/base/internal/sysinfo.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "services/rpc/token_file.h"

namespace kvtier {
namespace {

// Adds the bearer token to every call's initial metadata.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::shared_ptr<TokenFile> token) : token_(std::move(token)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *token_->Header());
    }
    methods->Proceed();
  }

 private:
  std::shared_ptr<TokenFile> token_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::shared_ptr<TokenFile> token) : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new TokenInterceptor(token_);
  }

 private:
  std::shared_ptr<TokenFile> token_;
};

struct Identity {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  std::shared_ptr<TokenFile> token;  // null: no token
  bool tls = false;
  bool certificate = false;  // presents tls.crt
};

absl::Mutex identity_mu;
Identity& CurrentIdentity() ABSL_EXCLUSIVE_LOCKS_REQUIRED(identity_mu) {
  static Identity* identity = new Identity;
  return *identity;
}

absl::StatusOr<Identity> LoadIdentity(const ClientIdentityOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = ChannelCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  Identity identity;
  identity.credentials = *std::move(credentials);
  identity.tls = !options.tls.dir.empty();
  identity.certificate = identity.tls && ChannelPresentsCertificate(options.tls);
  if (!options.token_file.empty()) {
    absl::StatusOr<std::shared_ptr<TokenFile>> token =
        TokenFile::Open(options.token_file, absl::Seconds(options.tls.reload_seconds));
    if (!token.ok()) return token.status();
    identity.token = *std::move(token);
  }
  return identity;
}

grpc::ChannelArguments Settings(Connection connection) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20);
  if (connection == Connection::kOwn) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetLoadBalancingPolicyName("round_robin");
  return args;
}

// gRPC 1.51 reads connect(2)'s errno only after taking its own mutexes
// (grpc/grpc#35064 saves it first), and the first absl::Mutex wait in a
// process looks for /sys/devices/system/cpu/cpu0/tsc_freq_khz, which most
// kernels lack: where that wait falls in a connect, its ENOENT fails the
// connection and gRPC waits out its reconnect backoff. Several channels
// connecting at once (a large read's streams) hit it. Doing that lookup
// before any channel connects keeps it out of every connect.
void LookUpCpuFrequencyBeforeConnecting() {
  [[maybe_unused]] static const double frequency = absl::base_internal::NominalCPUFrequency();
}

std::shared_ptr<grpc::Channel> ChannelWith(const Identity& identity, const std::string& target, Connection connection) {
  LookUpCpuFrequencyBeforeConnecting();
  const grpc::ChannelArguments args = Settings(connection);
  if (identity.token == nullptr) return grpc::CreateCustomChannel(target, identity.credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<TokenInterceptorFactory>(identity.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, identity.credentials, args,
                                                                 std::move(interceptors));
}

}  // namespace

absl::Status SetClientIdentity(const ClientIdentityOptions& options) {
  absl::StatusOr<Identity> identity = LoadIdentity(options);
  if (!identity.ok()) return identity.status();
  absl::MutexLock lock(&identity_mu);
  CurrentIdentity() = *std::move(identity);
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, Connection connection) {
  Identity identity;
  {
    absl::MutexLock lock(&identity_mu);
    identity = CurrentIdentity();
  }
  return ChannelWith(identity, target, connection);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannelAs(const ClientIdentityOptions& options,
                                                             const std::string& target, Connection connection) {
  absl::StatusOr<Identity> identity = LoadIdentity(options);
  if (!identity.ok()) return identity.status();
  return ChannelWith(*identity, target, connection);
}

std::string ConnectionHint(const absl::Status& status) {
  // What a client sees when the server dropped the connection in its TLS
  // handshake: the reason is only in the server's log.
  if (status.code() != absl::StatusCode::kUnavailable || !absl::StrContains(status.message(), "Socket closed")) {
    return "";
  }
  Identity identity;
  {
    absl::MutexLock lock(&identity_mu);
    identity = CurrentIdentity();
  }
  if (!identity.tls) return " (if the server uses TLS, give --tls-dir with its ca.crt)";
  if (!identity.certificate) {
    return " (if the server requires client certificates, put tls.crt and tls.key beside ca.crt in --tls-dir)";
  }
  return "";
}

}  // namespace kvtier
