#include "services/base/bind_check.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "services/base/address.h"

namespace kvtier {

absl::StatusOr<AddressList> ListenAddresses(const std::string& address) {
  // getaddrinfo takes a port past 65535 and keeps its low 16 bits.
  if (absl::Status s = ValidateListenAddress(address); !s.ok()) return s;
  std::string host = address.substr(0, address.rfind(':'));
  const std::string port = address.substr(address.rfind(':') + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int e = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); e != 0) {
    return absl::UnavailableError(gai_strerror(e));
  }
  return AddressList(found, freeaddrinfo);
}

std::string WhyCannotBind(const std::string& address) {
  absl::StatusOr<AddressList> found = ListenAddresses(address);
  if (!found.ok()) return std::string(found.status().message());
  std::string why = "gRPC refused it";
  for (const addrinfo* a = found->get(); a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as gRPC does
    const bool bound = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!bound) why = std::strerror(errno);
    close(fd);
    if (!bound) break;
  }
  return why;
}

}  // namespace kvtier
