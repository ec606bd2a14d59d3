#include "services/server/process_metrics.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "services/base/version.h"
#include "services/rpc/tls_files.h"
#include "services/server/metric_family.h"

namespace kvtier {

ProcessMetrics::ProcessMetrics(std::string program, std::string proc)
    : program_(std::move(program)), proc_(std::move(proc)) {}

std::vector<prometheus::MetricFamily> ProcessMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> out;
  prometheus::MetricFamily build =
      Family("kvtier_build_info", "Always 1; which program and version this is.", prometheus::MetricType::Gauge);
  AddSample(build, 1, {{"program", program_}, {"version", kKvtierVersion}});
  out.push_back(std::move(build));

  // statm: sizes in pages; the second is what is resident.
  uint64_t size_pages = 0, resident_pages = 0;
  if (std::ifstream statm(proc_ + "/statm"); statm >> size_pages >> resident_pages) {
    prometheus::MetricFamily rss =
        Family("process_resident_memory_bytes", "Resident memory size in bytes.", prometheus::MetricType::Gauge);
    AddSample(rss, static_cast<double>(resident_pages) * static_cast<double>(sysconf(_SC_PAGESIZE)));
    out.push_back(std::move(rss));
  }
  std::error_code error;
  size_t fds = 0;
  for (auto it = std::filesystem::directory_iterator(proc_ + "/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++fds;
  }
  if (!error) {
    prometheus::MetricFamily open =
        Family("process_open_fds", "Number of open file descriptors.", prometheus::MetricType::Gauge);
    AddSample(open, static_cast<double>(fds));
    out.push_back(std::move(open));
  }
  // stat: fields 14 and 15 are user and system time in clock ticks; the
  // second field (the name) may hold spaces, so count from its ')'.
  std::ifstream stat_file(proc_ + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  if (const size_t name_end = stat.rfind(')'); name_end != std::string::npos) {
    std::istringstream fields(stat.substr(name_end + 2));
    std::string skipped;
    for (int field = 3; field < 14; ++field) fields >> skipped;  // state .. cmajflt
    uint64_t user = 0, system = 0;
    if (fields >> user >> system) {
      prometheus::MetricFamily cpu = Family("process_cpu_seconds_total", "Total user and system CPU time in seconds.",
                                            prometheus::MetricType::Counter);
      AddSample(cpu, static_cast<double>(user + system) / static_cast<double>(sysconf(_SC_CLK_TCK)));
      out.push_back(std::move(cpu));
    }
  }
  AddTlsFiles(out);
  return out;
}

void AddTlsFiles(std::vector<prometheus::MetricFamily>& out) {
  const std::vector<TlsFiles::Health> all = TlsFiles::SharedHealth();
  if (all.empty()) return;
  prometheus::MetricFamily rejected =
      Family("kvtier_tls_files_rejected_total",
             "Versions of --tls-dir's files refused (not whole: no key, no certificate, or a certificate that is not "
             "the key's); the last good ones stayed in force.",
             prometheus::MetricType::Counter);
  prometheus::MetricFamily in_force =
      Family("kvtier_tls_files_in_force",
             "1 when what --tls-dir's files hold now is served; 0 while they are refused and the last good ones are.",
             prometheus::MetricType::Gauge);
  prometheus::MetricFamily expiry =
      Family("kvtier_tls_certificate_expiry_timestamp_seconds", "When the served certificate expires, Unix seconds.",
             prometheus::MetricType::Gauge);
  prometheus::MetricFamily crl_due =
      Family("kvtier_tls_crl_next_update_timestamp_seconds",
             "When the first of the served revocation lists (ca.crl) falls due, Unix seconds: past it, every "
             "certificate of that list's CA is refused until a newer list is in force.",
             prometheus::MetricType::Gauge);
  for (const TlsFiles::Health& h : all) {
    AddSample(rejected, static_cast<double>(h.rejected), {{"dir", h.dir}});
    AddSample(in_force, h.in_force ? 1 : 0, {{"dir", h.dir}});
    if (h.not_after != 0) AddSample(expiry, static_cast<double>(h.not_after), {{"dir", h.dir}});
    if (h.crl_next_update != 0) AddSample(crl_due, static_cast<double>(h.crl_next_update), {{"dir", h.dir}});
  }
  out.push_back(std::move(rejected));
  out.push_back(std::move(in_force));
  if (!expiry.metric.empty()) out.push_back(std::move(expiry));
  if (!crl_due.metric.empty()) out.push_back(std::move(crl_due));
}

}  // namespace kvtier
