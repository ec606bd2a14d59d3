// A real Prometheus (Debian's `prometheus`) for tests: scrapes the given
// /metrics addresses every 250 ms, evaluates rule files as often, and
// answers PromQL through its HTTP API.
#ifndef KVTIER_TESTS_INTEGRATION_PROMETHEUS_SERVER_H_
#define KVTIER_TESTS_INTEGRATION_PROMETHEUS_SERVER_H_

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "services/base/child_process.h"
#include "tests/eventually.h"

namespace kvtier::testing {

class PrometheusServer {
 public:
  PrometheusServer(const std::vector<std::string>& targets, const std::vector<std::string>& rule_files = {})
      : dir_(std::filesystem::temp_directory_path() /
             ("kvtier_prometheus_" + std::to_string(getpid()) + "_" + std::to_string(next_++))) {
    std::filesystem::create_directories(dir_);
    {
      std::ofstream config(dir_ / "prometheus.yml");
      config << "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n  evaluation_interval: 250ms\n";
      if (!rule_files.empty()) {
        config << "rule_files:\n";
        for (const std::string& f : rule_files) config << "  - " << f << "\n";
      }
      config << "scrape_configs:\n  - job_name: kvtier\n    static_configs:\n      - targets: [";
      for (size_t i = 0; i < targets.size(); ++i) config << (i ? ", " : "") << "'" << targets[i] << "'";
      config << "]\n";
    }
    const int port = FreeLoopbackPort();
    if (port <= 0) return;
    address_ = "127.0.0.1:" + std::to_string(port);
    process_ = std::make_unique<ChildProcess>(std::vector<std::string>{
        "/usr/bin/prometheus", "--config.file=" + (dir_ / "prometheus.yml").string(),
        "--storage.tsdb.path=" + (dir_ / "data").string(), "--web.listen-address=" + address_, "--log.level=warn"});
  }
  ~PrometheusServer() {
    if (process_ != nullptr) process_->Stop(SIGTERM);
    std::filesystem::remove_all(dir_);
  }

  // The API's whole answer to an instant query (status, data or error);
  // nullopt when Prometheus does not answer at all.
  std::optional<nlohmann::json> Query(const std::string& promql) const {
    const CommandResult r =
        RunCommand("curl -sG http://" + address_ + "/api/v1/query --data-urlencode " + ShellQuoted("query=" + promql));
    if (r.exit_code != 0) return std::nullopt;
    nlohmann::json answer = nlohmann::json::parse(r.output, nullptr, /*allow_exceptions=*/false);
    if (answer.is_discarded()) return std::nullopt;
    return answer;
  }

  // The query's result once it has one (asked again until then: Prometheus
  // announces nothing), or the last answer after `timeout`.
  std::optional<nlohmann::json> QueryUntilPresent(const std::string& promql,
                                                  std::chrono::milliseconds timeout = std::chrono::seconds(30)) const {
    std::optional<nlohmann::json> answer;
    Eventually(
        [&] {
          answer = Query(promql);
          return answer.has_value() && (*answer)["status"] == "success" && !(*answer)["data"]["result"].empty();
        },
        timeout);
    return answer;
  }

  // The first sample's value of a query, once there is one.
  std::optional<double> ValueOf(const std::string& promql) const {
    std::optional<nlohmann::json> answer = QueryUntilPresent(promql);
    if (!answer.has_value() || (*answer)["status"] != "success" || (*answer)["data"]["result"].empty()) {
      return std::nullopt;
    }
    return std::stod((*answer)["data"]["result"][0]["value"][1].get<std::string>());
  }

  const std::string& address() const { return address_; }

 private:
  static std::string ShellQuoted(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  }

  static inline int next_ = 0;
  const std::filesystem::path dir_;
  std::string address_;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_PROMETHEUS_SERVER_H_
