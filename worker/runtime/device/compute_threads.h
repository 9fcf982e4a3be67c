// How many LibTorch compute (intra-op) threads a worker's task uses. The policy:
//   - `--threads N` (or $STAGECOACH_THREADS) on the worker: N;
//   - otherwise the CPUs this process may use (its affinity mask, capped by a cgroup CPU quota
//     such as a Kubernetes CPU limit) divided among the ranks of the task's job whose workers
//     share this host (TaskAssignment.ranks_on_host), at least one each.
// Communication threads (gRPC's, the heartbeat's, Gloo's I/O loop) are not counted: they
// mostly wait, and a compute thread per CPU keeps the CPUs busy while they do
// (docs/runtime.md, "Threads").
//
// OpenMP keeps its thread count per calling thread, so UseComputeThreads must run on each
// thread that computes (a task's thread, an inspection's), before it does.
// No LibTorch in this header.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace stagecoach::runtime {

// The CPUs a process may use.
struct CpuAllowance {
  int affinity_cpus = 1;             // CPUs in its affinity mask
  std::optional<double> quota_cpus;  // cgroup quota ÷ period, when a quota is set
};

// The calling process's affinity mask, CPU numbers in order (empty when it cannot be read).
std::vector<int> AffinityMask();

// This process's: sched_getaffinity (AffinityMask), then cgroup v2's cpu.max or v1's
// cpu.cfs_quota_us and cpu.cfs_period_us under /sys/fs/cgroup.
CpuAllowance ReadCpuAllowance();

// The quota of cgroup v2's cpu.max text ("max 100000": none; "150000 100000": 1.5 CPUs).
std::optional<double> ParseCgroupV2CpuMax(absl::string_view text);
// The quota of cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us texts (-1: none).
std::optional<double> ParseCgroupV1Quota(absl::string_view quota_us, absl::string_view period_us);

// min(affinity, quota rounded down), at least 1.
int AllowedCpus(const CpuAllowance& allowance);

// `requested` (> 0: --threads) or AllowedCpus ÷ max(1, ranks_on_host), at least 1.
int ChooseComputeThreads(int requested, const CpuAllowance& allowance, int ranks_on_host);

// Why ChooseComputeThreads chose what it did, for the worker's log.
std::string DescribeComputeThreads(int requested, const CpuAllowance& allowance, int ranks_on_host);

// Sets LibTorch's intra-op thread count (OpenMP's and BLAS's) on the calling thread.
void UseComputeThreads(int threads);

}  // namespace stagecoach::runtime
