// What every kvtier server reports about itself on /metrics, read at
// scrape time: kvtier_build_info{program,version} (always 1), and the
// process's resident memory, open descriptors and CPU seconds under the
// names Prometheus's own clients use (process_resident_memory_bytes,
// process_open_fds, process_cpu_seconds_total); with --tls-dir, the TLS
// files' health (AddTlsFiles).
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

// kvtier_tls_files_rejected_total, kvtier_tls_files_in_force and
// kvtier_tls_certificate_expiry_timestamp_seconds for each --tls-dir in use
// (TlsFiles::SharedHealth); nothing when there is none.
void AddTlsFiles(std::vector<prometheus::MetricFamily>& out);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_SERVER_PROCESS_METRICS_H_
