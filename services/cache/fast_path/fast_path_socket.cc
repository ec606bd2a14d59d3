#include "services/cache/fast_path/fast_path_socket.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace kvtier::cache::fastpath {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Fills `addr` for `path`; returns the address length.
socklen_t ToAddress(const std::string& path, sockaddr_un& addr) {
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract: no file, no cleanup
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
}

}  // namespace

const std::string& HostBootId() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string line;
    std::getline(in, line);
    return line;
  }();
  return id;
}

absl::Status CheckSocketPath(const std::string& path) {
  if (path.size() < 2 || path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix socket path '", path, "' must be 2 to ", sizeof(sockaddr_un::sun_path) - 1, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Listen(const std::string& path) {
  if (absl::Status s = CheckSocketPath(path); !s.ok()) return s;
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Errno("socket");
  sockaddr_un addr;
  const socklen_t len = ToAddress(path, addr);
  if (path[0] != '@') unlink(path.c_str());  // a previous server's leftover
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0) {
    absl::Status s = Errno(absl::StrCat("unix socket ", path));
    close(fd);
    return s;
  }
  return fd;
}

absl::StatusOr<int> Connect(const std::string& path) {
  if (absl::Status s = CheckSocketPath(path); !s.ok()) return s;
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  sockaddr_un addr;
  const socklen_t len = ToAddress(path, addr);
  // A cache that stops answering must not hang its client.
  const timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    absl::Status s = Errno(absl::StrCat("connect to ", path));
    close(fd);
    return s;
  }
  return fd;
}

absl::Status SendRequest(int socket, const Request& request) {
  if (send(socket, &request, sizeof request, MSG_NOSIGNAL) != sizeof request) {
    return Errno("fast path request");
  }
  return absl::OkStatus();
}

absl::Status ReceiveRequest(int socket, Request& request) {
  const ssize_t n = recv(socket, &request, sizeof request, MSG_DONTWAIT);
  if (n == 0) return absl::UnavailableError("peer closed");
  if (n != sizeof request) return absl::InvalidArgumentError("malformed fast path request");
  return absl::OkStatus();
}

absl::Status SendReply(int socket, const absl::Status& status, int fd, const DeviceGrant& device) {
  Reply reply;
  reply.code = static_cast<int32_t>(status.code());
  reply.device = device;
  const absl::string_view text = status.message();
  if (!text.empty()) {  // an OK status's message may be a null view
    std::memcpy(reply.message.data(), text.data(), std::min(text.size(), reply.message.size() - 1));
  }
  iovec io{&reply, sizeof reply};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  // Never waits: a client that does not read its replies is dropped.
  if (sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof reply) return Errno("fast path reply");
  return absl::OkStatus();
}

absl::Status ReceiveReply(int socket, int& fd, DeviceGrant* device) {
  fd = -1;
  if (device != nullptr) *device = DeviceGrant();
  Reply reply;
  iovec io{&reply, sizeof reply};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && fd < 0) {
      std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
    }
  }
  if (n != sizeof reply || (msg.msg_flags & MSG_CTRUNC) != 0) {
    if (fd >= 0) close(fd);
    fd = -1;
    if (n == 0) return absl::UnavailableError("the cache closed the fast path socket");
    return n < 0 ? Errno("fast path reply") : absl::UnavailableError("malformed fast path reply");
  }
  reply.message.back() = '\0';
  const absl::Status status(static_cast<absl::StatusCode>(reply.code), reply.message.data());
  if (!status.ok() && fd >= 0) {
    close(fd);
    fd = -1;
  }
  if (status.ok() && device != nullptr) *device = reply.device;
  return status;
}

}  // namespace kvtier::cache::fastpath
