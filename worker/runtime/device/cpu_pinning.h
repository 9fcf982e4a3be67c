// Pinning a task's compute threads to CPUs of their own. Two workers of one job on one machine
// each run a compute thread at full load next to communication threads that wake for every
// message; unpinned, the scheduler moves the compute threads between the cores they share, and
// each move costs the moved thread its warm L2 cache (on a 2-core machine: 265 migrations and
// 7,700 context switches per worker in 5 s of a 1F1B job, against 62 and 1,800 for PyTorch's
// runtime; pinning took 8-15% off the step time, bench/peer_bench.cc).
//
// The policy (ChooseComputeCpus): pin only where the ranks' CPUs cannot collide, i.e. where
//   - pinning is on (the worker's default; --no-pin-threads turns it off),
//   - several of the job's ranks run on workers at this host (TaskAssignment.ranks_on_host >= 2:
//     the coordinator saw them at one address, so they share this machine and, being in one
//     network namespace, its CPU set; a worker alone at its address, such as a Kubernetes pod,
//     is never pinned: pods of one node see the same CPU numbers in their masks),
//   - no cgroup CPU quota caps the process (a quota shares time, not CPUs), and
//   - the affinity mask holds `threads` CPUs for every one of those ranks.
// Then the rank at index_on_host i takes the mask's CPUs i*threads ... (i+1)*threads-1, in
// increasing order. Communication threads stay unpinned. OpenMP's threads, which the task's
// thread starts, inherit its mask.
// No LibTorch in this header.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace stagecoach::runtime {

struct PinningInputs {
  bool enabled = true;        // not --no-pin-threads
  std::vector<int> affinity;  // AffinityMask() (compute_threads.h): CPU numbers in order
  bool quota = false;         // a cgroup CPU quota applies
  int threads = 1;            // the task's compute threads
  int ranks_on_host = 1;      // TaskAssignment.ranks_on_host (0 read as 1)
  int index_on_host = 0;      // TaskAssignment.index_on_host
};

struct PinningChoice {
  std::vector<int> cpus;  // empty: not pinned
  std::string why;        // for the worker's log: "pinned to CPU 1 (...)" or "not pinned: ..."
};

PinningChoice ChooseComputeCpus(const PinningInputs& in);

// Restricts the calling thread (and threads it starts later) to `cpus`.
absl::Status PinCallingThread(const std::vector<int>& cpus);

}  // namespace stagecoach::runtime
