#include "services/base/metrics_page.h"

#include <algorithm>
#include <cstdlib>

#include "services/base/child_process.h"

namespace kvtier {

std::string ScrapeMetrics(const std::string& address) {
  const CommandResult r = RunCommand("curl -sf http://" + address + "/metrics");
  return r.exit_code == 0 ? r.output : "";
}

std::optional<double> MetricValue(std::string_view page, std::string_view series) {
  for (size_t line = 0; line < page.size();) {
    const size_t end = std::min(page.find('\n', line), page.size());
    const std::string_view text = page.substr(line, end - line);
    if (text.starts_with(series) && text.substr(series.size()).starts_with(' ')) {
      return std::strtod(std::string(text.substr(series.size() + 1)).c_str(), nullptr);
    }
    line = end + 1;
  }
  return std::nullopt;
}

}  // namespace kvtier
