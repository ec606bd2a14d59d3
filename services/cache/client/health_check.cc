#include "services/cache/client/health_check.h"

#include <grpcpp/generic/generic_stub.h>

#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "services/cache/client/cache_client.h"
#include "services/rpc/grpc_status.h"

namespace kvtier::cache {

absl::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, absl::Duration deadline) {
  grpc::GenericStub generic(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
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

void WaitWhileConnecting(grpc::Channel& channel, absl::Duration budget) {
  const auto until = absl::ToChronoTime(absl::Now() + budget);
  for (grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
       state == GRPC_CHANNEL_IDLE || state == GRPC_CHANNEL_CONNECTING; state = channel.GetState(true)) {
    if (!channel.WaitForStateChange(state, until)) return;
  }
}

}  // namespace kvtier::cache
