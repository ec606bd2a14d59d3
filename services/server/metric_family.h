// Building Prometheus samples by hand, for collectables that read their
// figures at scrape time (the cache's store, the model servers' record
// pool) rather than keeping prometheus-cpp counters.
#ifndef KVTIER_SERVICES_SERVER_METRIC_FAMILY_H_
#define KVTIER_SERVICES_SERVER_METRIC_FAMILY_H_

#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>

#include <string>
#include <utility>
#include <vector>

namespace kvtier {

inline prometheus::MetricFamily Family(std::string name, std::string help, prometheus::MetricType type) {
  return prometheus::MetricFamily{std::move(name), std::move(help), type, {}};
}

// One sample of `family` (a counter's or a gauge's value, as its type says).
inline void AddSample(prometheus::MetricFamily& family, double value,
                      std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (family.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family.metric.push_back(std::move(m));
}

}  // namespace kvtier

#endif  // KVTIER_SERVICES_SERVER_METRIC_FAMILY_H_
