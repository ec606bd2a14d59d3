#include "services/base/address.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

// The port of "host:port", or -1 when there is no host or no number.
int PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return -1;
  return port;
}

}  // namespace

absl::Status ValidateListenAddress(const std::string& address) {
  const int port = PortOf(address);
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not HOST:PORT (port 0-65535, 0 = any free)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTargetAddress(const std::string& address) {
  const int port = PortOf(address);
  if (port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "' is not HOST:PORT (port 1-65535)"));
  }
  return absl::OkStatus();
}

std::string PeerHost(const std::string& peer) {
  if (peer.starts_with("ipv4:")) return peer.substr(5, peer.rfind(':') - 5);
  if (peer.starts_with("ipv6:[")) {
    const size_t close = peer.find(']');
    if (close != std::string::npos) return peer.substr(6, close - 6);
  }
  return peer;
}

}  // namespace kvtier
