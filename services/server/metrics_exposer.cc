#include "services/server/metrics_exposer.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "services/base/address.h"

namespace kvtier {

absl::Status CheckMetricsAddress(const std::string& address) {
  if (address.empty()) return absl::OkStatus();
  if (absl::Status s = ValidateListenAddress(address); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-listen: ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<MetricsEndpoint> StartMetricsExposer(
    const std::string& program, const std::string& address,
    const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables) {
  MetricsEndpoint endpoint;
  if (address.empty()) return endpoint;
  endpoint.process = std::make_shared<ProcessMetrics>(program);
  std::vector<std::shared_ptr<prometheus::Collectable>> served = collectables;
  served.push_back(endpoint.process);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server = MetricsHttpServer::Start(address, std::move(served));
  if (!server.ok()) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-listen: cannot serve metrics on ", address, ": ", server.status().message()));
  }
  endpoint.server = *std::move(server);
  const std::string host = address.substr(0, address.rfind(':'));
  std::cout << "metrics on " << host << ":" << endpoint.server->port() << "/metrics" << std::endl;
  return endpoint;
}

}  // namespace kvtier
