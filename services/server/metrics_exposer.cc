#include "services/server/metrics_exposer.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "services/base/bind_check.h"

namespace kvtier {

absl::StatusOr<MetricsEndpoint> StartMetricsExposer(
    const std::string& program, const std::string& address,
    const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables) {
  MetricsEndpoint endpoint;
  if (address.empty()) return endpoint;
  std::unique_ptr<prometheus::Exposer>& exposer = endpoint.exposer;
  try {
    // civetweb's defaults (two threads, 30 s to wait for a request) let two
    // silent connections blind a scrape for half a minute: more threads,
    // and a connection that sends nothing for a while is dropped.
    exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", "16", "request_timeout_ms", "2000", "enable_keep_alive", "no"});
  } catch (const std::exception& e) {
    // civetweb's own words ("null context when constructing CivetServer")
    // do not say why; bind(2) does.
    return absl::UnavailableError(
        absl::StrCat("--metrics-listen: cannot serve metrics on ", address, ": ", WhyCannotBind(address)));
  }
  for (const auto& c : collectables) exposer->RegisterCollectable(c);
  endpoint.process = std::make_shared<ProcessMetrics>(program);
  exposer->RegisterCollectable(endpoint.process);
  const std::string host = address.substr(0, address.rfind(':'));
  std::cout << "metrics on " << host << ":" << exposer->GetListeningPorts().at(0) << "/metrics" << std::endl;
  return endpoint;
}

}  // namespace kvtier
