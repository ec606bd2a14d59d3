#include "services/rpc/caller.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "services/base/status.h"

namespace kvtier {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::ServerRpcInfo;

// Each call's caller, by its context, from the interceptor's finding until
// the call's end. gRPC gives an interceptor no slot of its own in the
// context, hence this table; sharded so that calls on many threads seldom
// wait for each other.
class CallerTable {
 public:
  struct Entry {
    const void* owner;  // the interceptor that found it
    absl::StatusOr<std::shared_ptr<const Caller>> caller;
  };

  void Set(const grpc::ServerContextBase* context, Entry entry) {
    Shard& s = ShardOf(context);
    absl::MutexLock lock(&s.mu);
    s.entries.insert_or_assign(context, std::move(entry));
  }
  // Only `owner`'s entry: a context freed and reused for a later call
  // while this interceptor lived carries that call's entry.
  void Erase(const grpc::ServerContextBase* context, const void* owner) {
    Shard& s = ShardOf(context);
    absl::MutexLock lock(&s.mu);
    auto it = s.entries.find(context);
    if (it != s.entries.end() && it->second.owner == owner) s.entries.erase(it);
  }
  absl::StatusOr<Entry> Get(const grpc::ServerContextBase* context) {
    Shard& s = ShardOf(context);
    absl::MutexLock lock(&s.mu);
    auto it = s.entries.find(context);
    if (it == s.entries.end()) {
      return absl::InternalError("this call was not authenticated (the server has no caller interceptor)");
    }
    return it->second;
  }

 private:
  struct Shard {
    absl::Mutex mu;
    absl::flat_hash_map<const grpc::ServerContextBase*, Entry> entries ABSL_GUARDED_BY(mu);
  };
  Shard& ShardOf(const grpc::ServerContextBase* context) {
    const auto bits = reinterpret_cast<uintptr_t>(context);
    return shards_[(bits >> 6 ^ bits >> 12) % shards_.size()];
  }
  std::array<Shard, 16> shards_;
};

CallerTable& Table() {
  static auto* table = new CallerTable();
  return *table;
}

// Who calls, or why they may not: a client whose certificate no longer
// passes the TLS files in force is refused before its credentials count.
absl::StatusOr<std::shared_ptr<const Caller>> Identify(const CallChecks& checks,
                                                       const grpc::ServerContextBase& context) {
  if (checks.tls_files != nullptr) {
    KVTIER_RETURN_IF_ERROR(checks.tls_files->CheckClient(PeerCertificateChain(context)));
  }
  return Authenticate(checks.tenants, context, checks.method);
}

class CallerInterceptor : public grpc::experimental::Interceptor {
 public:
  CallerInterceptor(ServerRpcInfo* info, CallChecks checks) : info_(info), checks_(checks) {}
  ~CallerInterceptor() override { Table().Erase(info_->server_context(), this); }

  const CallChecks& checks() const { return checks_; }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // The headers are in, and the handler has not run yet.
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      Table().Set(info_->server_context(), {this, Identify(checks_, *info_->server_context())});
    }
    methods->Proceed();
  }

 private:
  ServerRpcInfo* const info_;
  const CallChecks checks_;
};

}  // namespace

grpc::experimental::Interceptor* CallerInterceptorFactory::CreateServerInterceptor(ServerRpcInfo* info) {
  // kvtier's own services only ("/kvtier.v1.KvCache/Get"): health and
  // reflection answer anyone.
  if (!std::string_view(info->method()).starts_with("/kvtier.")) return nullptr;
  return new CallerInterceptor(info, {tenants_, tls_files_, info->method()});
}

absl::StatusOr<std::shared_ptr<const Caller>> CallerOf(const grpc::ServerContextBase& context) {
  KVTIER_ASSIGN_OR_RETURN(CallerTable::Entry entry, Table().Get(&context));
  return entry.caller;
}

absl::StatusOr<std::shared_ptr<const Caller>> FollowedCaller::Now(const grpc::ServerContextBase& context) {
  if (checks_.method == nullptr) {  // the first time: as the call began
    KVTIER_ASSIGN_OR_RETURN(CallerTable::Entry entry, Table().Get(&context));
    KVTIER_ASSIGN_OR_RETURN(caller_, std::move(entry.caller));
    checks_ = static_cast<const CallerInterceptor*>(entry.owner)->checks();
  }
  if (checks_.tls_files != nullptr) {
    const uint64_t in_force = checks_.tls_files->trust_version();
    if (in_force != trust_version_) {
      KVTIER_RETURN_IF_ERROR(checks_.tls_files->CheckClient(PeerCertificateChain(context)));
      trust_version_ = in_force;
    }
  }
  if (checks_.tenants != nullptr && caller_->file_version != checks_.tenants->Version()) {
    KVTIER_ASSIGN_OR_RETURN(caller_, checks_.tenants->Authenticate(context, checks_.method));
  }
  return caller_;
}

std::string PeerCertificateChain(const grpc::ServerContextBase& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  // On a server, OpenSSL's peer chain may leave out the client's own
  // certificate: it goes first, and a second copy of it is harmless.
  std::string chain;
  for (const char* property : {GRPC_X509_PEM_CERT_PROPERTY_NAME, GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME}) {
    const std::vector<grpc::string_ref> values = auth->FindPropertyValues(property);
    if (values.empty()) continue;
    chain.append(values.front().data(), values.front().size());
    if (!chain.empty() && chain.back() != '\n') chain += '\n';  // PEM's lines apart
  }
  return chain;
}

}  // namespace kvtier
