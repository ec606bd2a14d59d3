#include "services/server/process_metrics.h"

#include <gtest/gtest.h>
#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "tests/temp_dir.h"

namespace kvtier {
namespace {

// Each family's first sample, by name; labels of kvtier_build_info.
std::map<std::string, double> Values(const std::vector<prometheus::MetricFamily>& families) {
  std::map<std::string, double> values;
  for (const auto& f : families) {
    const prometheus::ClientMetric& m = f.metric.at(0);
    values[f.name] = f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
  }
  return values;
}

TEST(ProcessMetrics, ReadsAProcEntry) {
  testing::TempDir proc("kvtier-proc");
  std::ofstream(proc.path() / "statm") << "5000 1200 300 10 0 900 0\n";
  std::filesystem::create_directory(proc.path() / "fd");
  for (const char* fd : {"0", "1", "2", "7"}) std::ofstream(proc.path() / "fd" / fd) << "";
  // A name with a space and a ')' in it; utime 250, stime 150 ticks.
  std::ofstream(proc.path() / "stat") << "42 (kv tier) x) S 1 42 42 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 9 0\n";
  const std::vector<prometheus::MetricFamily> families = ProcessMetrics("kvtier-test", proc.path().string()).Collect();
  const std::map<std::string, double> values = Values(families);
  EXPECT_EQ(values.at("kvtier_build_info"), 1.0);
  EXPECT_EQ(families.at(0).metric.at(0).label.at(0).value, "kvtier-test");
  EXPECT_EQ(values.at("process_resident_memory_bytes"), 1200.0 * sysconf(_SC_PAGESIZE));
  EXPECT_EQ(values.at("process_open_fds"), 4.0);
  EXPECT_DOUBLE_EQ(values.at("process_cpu_seconds_total"), 400.0 / sysconf(_SC_CLK_TCK));
}

TEST(ProcessMetrics, SaysOnlyWhatItCanRead) {
  testing::TempDir proc("kvtier-proc");  // empty: no /proc entry at all
  const std::map<std::string, double> values = Values(ProcessMetrics("kvtier-test", proc.path().string()).Collect());
  EXPECT_EQ(values.size(), 1u);                                                            // the build info alone
  EXPECT_GT(Values(ProcessMetrics("kvtier-test").Collect()).at("process_open_fds"), 2.0);  // this process's own
}

}  // namespace
}  // namespace kvtier
