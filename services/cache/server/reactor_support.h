// What the cache service's reactors share: timing an RPC into its
// metrics, deleting a reactor safely from its OnDone, the busy answer.
// Private to services/cache/server.
#ifndef KVTIER_SERVICES_CACHE_SERVER_REACTOR_SUPPORT_H_
#define KVTIER_SERVICES_CACHE_SERVER_REACTOR_SUPPORT_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "services/cache/server/rpc_metrics.h"

namespace kvtier::cache {

// Times an RPC from construction to Done(code).
class RpcTimer {
 public:
  RpcTimer(RpcMetrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)), start_(absl::Now()) {}
  void Done(grpc::StatusCode code) {
    if (metrics_ != nullptr) metrics_->Observe(method_, code, absl::Now() - start_);
  }

 private:
  RpcMetrics* metrics_;
  std::string method_;
  absl::Time start_;
};

// Deletes a reactor from its OnDone. The thread that decided to finish let
// go of the reactor's `mu` after its last touch of it; taking `mu` once
// here orders that before the delete, whatever gRPC's hand-off to this
// thread does.
template <typename Reactor>
void DeleteWhenDone(Reactor* reactor, absl::Mutex& mu) {
  { absl::MutexLock lock(&mu); }
  delete reactor;
}

inline const grpc::Status kBusy(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                "kvtier-cache is at its work-queue limit; retry with backoff");

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_SERVER_REACTOR_SUPPORT_H_
