#include "services/cache/client/health_check.h"

#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "services/cache/client/cache_client.h"
#include "services/rpc/grpc_status.h"

namespace kvtier::cache {
namespace {

// The least time a check gives a channel to connect, and then the server
// to answer.
constexpr absl::Duration kLeastWait = absl::Seconds(1);

// Starts `channel` connecting if it is idle, and waits while it connects,
// until `until`: connected, or its attempt failed (refused, a failed
// handshake), which the call then reports.
void WaitWhileConnecting(grpc::Channel& channel, std::chrono::system_clock::time_point until) {
  for (grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
       state == GRPC_CHANNEL_IDLE || state == GRPC_CHANNEL_CONNECTING; state = channel.GetState(true)) {
    if (!channel.WaitForStateChange(state, until)) return;
  }
}

}  // namespace

absl::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, absl::Duration deadline) {
  // Connecting (TCP, TLS's handshake) is not the server's answer, and on a
  // new or reset channel it can outlast a tight deadline. Nor is the
  // answer's speed: a shard that answers is there (each call it serves has
  // the deadline of its own), and one marked down is skipped until the
  // next check.
  const absl::Duration wait = std::max(deadline, kLeastWait);
  WaitWhileConnecting(*channel, absl::ToChronoTime(absl::Now() + wait));
  grpc::GenericStub generic(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + wait));
  grpc::Slice empty("");  // an empty HealthCheckRequest asks about the whole server
  grpc::ByteBuffer request(&empty, 1), response;
  grpc::Status status;
  absl::Notification done;
  generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      status = std::move(s);
                      done.Notify();
                    });
  done.WaitForNotification();
  if (!status.ok()) return FromGrpcStatus(status);
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  // HealthCheckResponse{status: SERVING} is field 1, varint 1.
  if (bytes != std::string("\x08\x01", 2)) return absl::UnavailableError("the server says it is not serving");
  return absl::OkStatus();
}

}  // namespace kvtier::cache
