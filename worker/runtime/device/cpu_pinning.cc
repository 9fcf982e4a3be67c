#include "worker/runtime/device/cpu_pinning.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stagecoach::runtime {

PinningChoice ChooseComputeCpus(const PinningInputs& in) {
  const int ranks = std::max(1, in.ranks_on_host);
  const int threads = std::max(1, in.threads);
  if (!in.enabled) return {{}, "not pinned (--no-pin-threads)"};
  if (ranks < 2) return {{}, "not pinned (the only rank of its job at this host address)"};
  if (in.quota) return {{}, "not pinned (a cgroup CPU quota shares time, not CPUs)"};
  if (static_cast<int>(in.affinity.size()) < ranks * threads) {
    return {{},
            absl::StrCat("not pinned (", in.affinity.size(), " CPUs in the affinity mask for ",
                         ranks, " ranks x ", threads, " threads)")};
  }
  if (in.index_on_host < 0 || in.index_on_host >= ranks) {
    return {{},
            absl::StrCat("not pinned (index ", in.index_on_host, " among ", ranks,
                         " ranks on this host)")};
  }
  PinningChoice choice;
  const auto first = in.affinity.begin() + in.index_on_host * threads;
  choice.cpus.assign(first, first + threads);
  choice.why =
      absl::StrCat("pinned to CPU", threads > 1 ? "s " : " ", absl::StrJoin(choice.cpus, ","),
                   " (rank ", in.index_on_host + 1, " of ", ranks, " on this host)");
  return choice;
}

absl::Status PinCallingThread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c < 0 || c >= CPU_SETSIZE) {
      return absl::InvalidArgumentError(absl::StrCat("CPU ", c, " is out of range"));
    }
    CPU_SET(c, &set);
  }
  const int error = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (error != 0) {
    return absl::InternalError(
        absl::StrCat("pinning to CPUs ", absl::StrJoin(cpus, ","), ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
