#include "services/cache/bulk_stream.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvtier::cache::bulk {
namespace {

absl::Status SocketError(const char* what, int error) {
  if (error == EAGAIN || error == EWOULDBLOCK) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": the peer stalled past the timeout"));
  }
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(error)));
}

}  // namespace

absl::StatusOr<int> OpenTcpSocket(const std::string& address, bool passive,
                                  const std::function<bool(int fd, const addrinfo& a)>& use) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size() || (colon == 0 && !passive)) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "' is not HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE | AI_NUMERICSERV : 0;
  addrinfo* found = nullptr;
  const std::string port = address.substr(colon + 1);
  if (int e = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); e != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve '", address, "': ", gai_strerror(e)));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (use(fd, *a)) {
      freeaddrinfo(found);
      return fd;
    }
    why = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat(address, ": ", why));
}

absl::Status ConfigureSocket(int fd, absl::Duration io_timeout) {
  const timeval tv = absl::ToTimeval(io_timeout);
  const int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    return absl::InternalError(absl::StrCat("setsockopt: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SendAll(int fd, std::span<iovec> pieces) {
  while (!pieces.empty()) {
    msghdr msg{};
    msg.msg_iov = pieces.data();
    msg.msg_iovlen = std::min<size_t>(pieces.size(), IOV_MAX);
    const ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return SocketError("send", errno);
    }
    // Skip what went, the first piece left possibly in part.
    size_t n = static_cast<size_t>(sent);
    while (!pieces.empty() && n >= pieces.front().iov_len) {
      n -= pieces.front().iov_len;
      pieces = pieces.subspan(1);
    }
    if (n > 0) {
      pieces.front().iov_base = static_cast<uint8_t*>(pieces.front().iov_base) + n;
      pieces.front().iov_len -= n;
    }
  }
  return absl::OkStatus();
}

absl::Status ReceiveAll(int fd, std::span<uint8_t> out, bool eof_ok) {
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = recv(fd, out.data() + got, out.size() - got, MSG_WAITALL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return SocketError("receive", errno);
    }
    if (n == 0) {
      if (got == 0 && eof_ok) return absl::NotFoundError("connection closed");
      return absl::UnavailableError(absl::StrCat("connection closed after ", got, " of ", out.size(), " bytes"));
    }
    got += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string FrameMessage(const absl::Status& status) {
  return std::string(status.message().substr(0, kMaxMessageBytes));
}

}  // namespace kvtier::cache::bulk
