// The standard gRPC health check (grpc.health.v1.Health/Check) of a whole
// server, without generated stubs for it: how decode and prefill tell
// whether a cache shard is there.
#ifndef KVTIER_SERVICES_CACHE_CLIENT_HEALTH_CHECK_H_
#define KVTIER_SERVICES_CACHE_CLIENT_HEALTH_CHECK_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kvtier::cache {

// OK when the server behind `channel` answers SERVING within a second or
// `deadline`, whichever is longer, after as long for a channel still
// connecting; else why not (the call's error, or UNAVAILABLE "not
// serving" from a server that is draining).
absl::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, absl::Duration deadline);

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_CLIENT_HEALTH_CHECK_H_
