// How many CPUs this process may use. std::thread::hardware_concurrency
// counts every core of the machine, but a process in a Kubernetes pod with
// a CPU limit (a cgroup CPU quota) or pinned to some cores (its CPU
// affinity) gets only a share: threads sized to the machine then wait on
// one another, or on the kernel's throttling of the cgroup.
#ifndef KVTIER_SERVICES_BASE_USABLE_CPUS_H_
#define KVTIER_SERVICES_BASE_USABLE_CPUS_H_

#include <optional>
#include <string_view>

namespace kvtier {

// The CPUs this process's affinity allows, and no more than the CPU quota
// of its cgroup or any cgroup above it (cgroup v2's cpu.max or v1's CFS
// quota, rounded up) where one is set. At least 1. Reads /proc and /sys
// each call.
unsigned UsableCpus();

// A quota in CPUs, rounded up, from cgroup v2's cpu.max ("QUOTA PERIOD" in
// microseconds, or "max PERIOD") or v1's cpu.cfs_quota_us and
// cpu.cfs_period_us (quota -1: none). nullopt for no quota, or text that
// does not parse.
std::optional<unsigned> CpusOfCpuMax(std::string_view cpu_max);
std::optional<unsigned> CpusOfCfsQuota(std::string_view quota_us, std::string_view period_us);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_USABLE_CPUS_H_
