#include "services/base/usable_cpus.h"

#include <sched.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "services/base/watched_file.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

// Debian's Abseil has a string_view of its own.
absl::string_view Trimmed(std::string_view text) {
  return absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size()));
}

std::optional<unsigned> CpusOf(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  return static_cast<unsigned>(std::min<int64_t>((quota + period - 1) / period, 1 << 20));
}

void KeepSmaller(std::optional<unsigned>& smallest, std::optional<unsigned> cpus) {
  if (cpus && (!smallest || *cpus < *smallest)) smallest = cpus;
}

unsigned AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1u, std::thread::hardware_concurrency());
}

// The smallest quota `quota_at(dir)` finds from `root` / `path` up to
// `root`. Where `root` / `path` does not exist (a container whose cgroup
// is the root of its own view, while /proc/self/cgroup names the host's
// path), `root` alone.
template <typename QuotaAt>
std::optional<unsigned> SmallestQuotaUp(const fs::path& root, absl::string_view path, QuotaAt quota_at) {
  std::error_code error;
  if (!fs::is_directory(root, error)) return std::nullopt;
  const absl::string_view below = absl::StripSuffix(absl::StripPrefix(path, "/"), "/");
  fs::path dir = below.empty() ? root : root / std::string(below);
  if (!fs::is_directory(dir, error)) dir = root;
  std::optional<unsigned> smallest;
  for (;;) {
    KeepSmaller(smallest, quota_at(dir));
    if (dir == root || dir.parent_path() == dir) break;  // the second: never past "/"
    dir = dir.parent_path();
  }
  return smallest;
}

// The quota of this process's cgroups, from /proc/self/cgroup's lines
// ("0::PATH" for v2, "ID:cpu,cpuacct:PATH" for v1).
std::optional<unsigned> CgroupCpus() {
  const absl::StatusOr<std::string> membership = ReadWholeFile("/proc/self/cgroup");
  if (!membership.ok()) return std::nullopt;
  std::optional<unsigned> smallest;
  for (absl::string_view line : absl::StrSplit(*membership, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (parts[0] == "0" && parts[1].empty()) {
      KeepSmaller(smallest,
                  SmallestQuotaUp("/sys/fs/cgroup", parts[2], [](const fs::path& dir) -> std::optional<unsigned> {
                    const absl::StatusOr<std::string> cpu_max = ReadWholeFile(dir / "cpu.max");
                    return cpu_max.ok() ? CpusOfCpuMax(*cpu_max) : std::nullopt;
                  }));
      continue;
    }
    const std::vector<absl::string_view> controllers = absl::StrSplit(parts[1], ',');
    if (std::find(controllers.begin(), controllers.end(), "cpu") == controllers.end()) continue;
    for (const char* mount : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
      KeepSmaller(smallest, SmallestQuotaUp(mount, parts[2], [](const fs::path& dir) -> std::optional<unsigned> {
                    const absl::StatusOr<std::string> quota = ReadWholeFile(dir / "cpu.cfs_quota_us");
                    const absl::StatusOr<std::string> period = ReadWholeFile(dir / "cpu.cfs_period_us");
                    return quota.ok() && period.ok() ? CpusOfCfsQuota(*quota, *period) : std::nullopt;
                  }));
    }
  }
  return smallest;
}

}  // namespace

std::optional<unsigned> CpusOfCpuMax(std::string_view cpu_max) {
  const std::vector<absl::string_view> fields = absl::StrSplit(Trimmed(cpu_max), ' ', absl::SkipEmpty());
  int64_t quota = 0, period = 0;
  if (fields.size() != 2 || fields[0] == "max" || !absl::SimpleAtoi(fields[0], &quota) ||
      !absl::SimpleAtoi(fields[1], &period)) {
    return std::nullopt;
  }
  return CpusOf(quota, period);
}

std::optional<unsigned> CpusOfCfsQuota(std::string_view quota_us, std::string_view period_us) {
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(Trimmed(quota_us), &quota) || !absl::SimpleAtoi(Trimmed(period_us), &period)) {
    return std::nullopt;
  }
  return CpusOf(quota, period);
}

unsigned UsableCpus() {
  const unsigned affinity = AffinityCpus();
  const std::optional<unsigned> quota = CgroupCpus();
  return std::max(1u, quota ? std::min(affinity, *quota) : affinity);
}

}  // namespace kvtier
