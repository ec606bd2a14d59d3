// The bulk stream: Get requests over a plain TCP connection, for remote
// readers of large prefixes. The gRPC Get answers the same requests with
// the same checks; this path leaves out HTTP/2's framing and the hand-offs
// between gRPC's threads, which on a small host cost as much as the copies
// (load/README.md, "The bulk stream").
//
// Wire format, little-endian, any number of requests one after another on
// one connection:
//   client: u32 kBulkRequestMagic, u32 n, n bytes of a v1::GetRequest
//   server: per block, in request order, a Frame {index, code, tier, length}
//           and `length` bytes: the record (code 0) or why it missed (the
//           message); then a Frame with index kBulkEndIndex, the request's
//           status code and its message.
// A request that cannot be read (wrong magic, over kMaxBulkRequestBytes)
// gets an end frame marked kClosing and the connection is closed, as does
// every request on a connection over the cache's limit
// (RESOURCE_EXHAUSTED); one that reads but is refused (a bad layout, an
// unknown namespace) gets an end frame and the connection stays.
#ifndef KVTIER_SERVICES_CACHE_BULK_STREAM_H_
#define KVTIER_SERVICES_CACHE_BULK_STREAM_H_

#include <sys/uio.h>

#include <bit>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct addrinfo;

namespace kvtier::cache::bulk {

static_assert(std::endian::native == std::endian::little, "the bulk stream is sent as laid out in memory");

inline constexpr uint32_t kBulkRequestMagic = 0x3142564b;  // "KVB1"
inline constexpr uint32_t kMaxBulkRequestBytes = 4 << 20;
inline constexpr uint32_t kBulkEndIndex = 0xffffffff;
inline constexpr uint32_t kMaxMessageBytes = 4096;  // of a miss or an end frame
// In an end frame's `tier`: the cache closes the connection after it.
inline constexpr uint32_t kClosing = 1;

struct RequestHead {
  uint32_t magic = kBulkRequestMagic;
  uint32_t length = 0;
};

struct Frame {
  uint32_t index = 0;
  uint32_t code = 0;  // absl::StatusCode
  uint32_t tier = 0;  // v1::Tier the record was read from; an end frame: 0 or kClosing
  uint32_t length = 0;
};

static_assert(sizeof(RequestHead) == 8 && sizeof(Frame) == 16, "wire sizes are fixed");

// A TCP socket for the first address of HOST:PORT ("[::1]:PORT" for IPv6)
// that `use` takes: `use` binds or connects it, and says whether it did.
// `passive`: addresses to listen on, where an empty host means any.
// INVALID_ARGUMENT for an address that does not resolve, UNAVAILABLE
// (with the last error) when `use` took none.
absl::StatusOr<int> OpenTcpSocket(const std::string& address, bool passive,
                                  const std::function<bool(int fd, const addrinfo& a)>& use);

// Sets the socket's send and receive timeouts (a stalled peer then fails a
// call instead of holding it forever) and TCP_NODELAY.
absl::Status ConfigureSocket(int fd, absl::Duration io_timeout);

// Sends all of `pieces` (several sendmsg calls when the kernel takes part;
// a piece sent in part is advanced in place, so entries may change): UNAVAILABLE
// when the peer is gone, DEADLINE_EXCEEDED when it stopped reading for
// longer than the send timeout.
absl::Status SendAll(int fd, std::span<iovec> pieces);

// Fills `out` from the socket. `eof_ok`: a peer that closed before the
// first byte is NOT_FOUND (a clean end) rather than UNAVAILABLE.
absl::Status ReceiveAll(int fd, std::span<uint8_t> out, bool eof_ok = false);

// The message of an end or miss frame, cut to kMaxMessageBytes.
std::string FrameMessage(const absl::Status& status);

}  // namespace kvtier::cache::bulk

#endif  // KVTIER_SERVICES_CACHE_BULK_STREAM_H_
