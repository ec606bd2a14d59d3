// Reading a server's Prometheus /metrics page, for the tests and benchmarks
// that watch the servers they start.
#ifndef KVTIER_SERVICES_BASE_METRICS_PAGE_H_
#define KVTIER_SERVICES_BASE_METRICS_PAGE_H_

#include <optional>
#include <string>
#include <string_view>

namespace kvtier {

// The page at http://`address`/metrics (curl); empty if it cannot be read.
std::string ScrapeMetrics(const std::string& address);

// The value of the sample `series` (its name and labels as the page writes
// them, e.g. `kvtier_decode_sequences` or `x{state="idle"}`); nullopt when
// the page has no such line.
std::optional<double> MetricValue(std::string_view page, std::string_view series);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_METRICS_PAGE_H_
