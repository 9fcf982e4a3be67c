#include "worker/runtime/device/compute_threads.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace stagecoach::runtime {
namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::vector<int> AffinityMask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

std::optional<double> ParseCgroupV2CpuMax(absl::string_view text) {
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(text), ' ', absl::SkipEmpty());
  double quota = 0;
  double period = 0;
  if (fields.size() != 2 || !absl::SimpleAtod(fields[0], &quota) ||
      !absl::SimpleAtod(fields[1], &period) || quota <= 0 || period <= 0) {
    return std::nullopt;  // "max", or not cpu.max's format
  }
  return quota / period;
}

std::optional<double> ParseCgroupV1Quota(absl::string_view quota_us, absl::string_view period_us) {
  double quota = 0;
  double period = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(quota_us), &quota) ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(period_us), &period) || quota <= 0 ||
      period <= 0) {
    return std::nullopt;  // -1: no quota
  }
  return quota / period;
}

CpuAllowance ReadCpuAllowance() {
  CpuAllowance allowance;
  allowance.affinity_cpus = std::max(1, static_cast<int>(AffinityMask().size()));
  const std::string v2 = ReadSmallFile("/sys/fs/cgroup/cpu.max");
  if (!v2.empty()) {
    allowance.quota_cpus = ParseCgroupV2CpuMax(v2);
  } else {
    allowance.quota_cpus =
        ParseCgroupV1Quota(ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
                           ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us"));
  }
  return allowance;
}

int AllowedCpus(const CpuAllowance& allowance) {
  int cpus = std::max(1, allowance.affinity_cpus);
  if (allowance.quota_cpus.has_value()) {
    cpus = std::min(cpus, static_cast<int>(std::floor(*allowance.quota_cpus)));
  }
  return std::max(1, cpus);
}

int ChooseComputeThreads(int requested, const CpuAllowance& allowance, int ranks_on_host) {
  if (requested > 0) return requested;
  return std::max(1, AllowedCpus(allowance) / std::max(1, ranks_on_host));
}

std::string DescribeComputeThreads(int requested, const CpuAllowance& allowance,
                                   int ranks_on_host) {
  const int threads = ChooseComputeThreads(requested, allowance, ranks_on_host);
  if (requested > 0) return absl::StrCat(threads, " compute threads (--threads)");
  std::string cpus = absl::StrCat(allowance.affinity_cpus, " CPUs in the affinity mask");
  if (allowance.quota_cpus.has_value()) {
    absl::StrAppend(&cpus, ", a cgroup quota of ", *allowance.quota_cpus);
  }
  return absl::StrCat(threads, " compute threads (", cpus, "; ", std::max(1, ranks_on_host),
                      " of the job's ranks on this host)");
}

void UseComputeThreads(int threads) { at::set_num_threads(std::max(1, threads)); }

}  // namespace stagecoach::runtime
