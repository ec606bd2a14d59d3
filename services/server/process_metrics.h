// What every kvtier server reports about itself on /metrics, read at
// scrape time: kvtier_build_info{program,version} (always 1), and the
// process's resident memory, open descriptors and CPU seconds under the
// names Prometheus's own clients use (process_resident_memory_bytes,
// process_open_fds, process_cpu_seconds_total).
#ifndef KVTIER_SERVICES_SERVER_PROCESS_METRICS_H_
#define KVTIER_SERVICES_SERVER_PROCESS_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <string>
#include <vector>

namespace kvtier {

class ProcessMetrics final : public prometheus::Collectable {
 public:
  // `program`: "kvtier-cache", ...; `proc`: where this process's /proc
  // entry is (a test's fake one).
  explicit ProcessMetrics(std::string program, std::string proc = "/proc/self");
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::string program_;
  const std::string proc_;
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_SERVER_PROCESS_METRICS_H_
