// The unix-socket half of the same-host fast path (fast_path.md): fixed-size
// messages on a SOCK_SEQPACKET connection, descriptors passed with
// SCM_RIGHTS. Shared by the cache (FastPathServer) and its clients.
#ifndef KVTIER_SERVICES_CACHE_FAST_PATH_FAST_PATH_SOCKET_H_
#define KVTIER_SERVICES_CACHE_FAST_PATH_FAST_PATH_SOCKET_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvtier::cache::fastpath {

enum class RequestKind : uint32_t {
  kHello = 1,    // proves the session: session_id + secret
  kSegment = 2,  // asks for a segment's read-only descriptor
  kRelease = 3,  // ends one of the session's leases; no reply
};

struct Request {
  RequestKind kind;
  uint32_t tier = 0;
  uint32_t segment = 0;
  uint32_t reserved = 0;
  uint64_t session_id = 0;  // kHello
  uint64_t generation = 0;  // kSegment; kRelease: the lease id
  std::array<uint8_t, 16> secret{};
};

// A GPU buffer of the session's own, granted with the answer to its proof:
// what a process on this host opens it with (cudaIpcOpenMemHandle).
struct DeviceGrant {
  uint64_t bytes = 0;  // 0: none granted
  std::array<char, 64> ipc_handle{};
};

struct Reply {
  int32_t code = 0;  // absl::StatusCode
  uint32_t reserved = 0;
  DeviceGrant device;  // kHello's answer only
  std::array<char, 120> message{};
};

static_assert(sizeof(Request) == 48 && sizeof(Reply) == 200, "wire sizes are fixed");

// This host's boot id (/proc/sys/kernel/random/boot_id: the same in every
// container on one host), or "" if unreadable.
const std::string& HostBootId();

// A sockaddr for `path`; a leading '@' names the abstract namespace.
absl::Status CheckSocketPath(const std::string& path);

// A listening socket at `path` (a file there is replaced).
absl::StatusOr<int> Listen(const std::string& path);
absl::StatusOr<int> Connect(const std::string& path);

// One message each way; `fd` (optional) and `device` travel with a reply.
// Receiving fails on a closed peer, a short message or a stray descriptor.
absl::Status SendRequest(int socket, const Request& request);
absl::Status ReceiveRequest(int socket, Request& request);
absl::Status SendReply(int socket, const absl::Status& status, int fd = -1, const DeviceGrant& device = {});
// The reply's status; `fd` is the descriptor it carried, or -1; `device`
// (optional) what it granted.
absl::Status ReceiveReply(int socket, int& fd, DeviceGrant* device = nullptr);

}  // namespace kvtier::cache::fastpath

#endif  // KVTIER_SERVICES_CACHE_FAST_PATH_FAST_PATH_SOCKET_H_
