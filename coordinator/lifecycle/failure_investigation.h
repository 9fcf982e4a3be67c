// Failure investigation: when a rank reports that its task failed, the failure it saw may be a
// symptom (a broken connection) of a peer that died. Before the job fails or restarts, the
// peers still running are probed (WorkerService.GetWorkerStatus); a peer that does not answer
// is lost, and it, not the reporting rank, is named as the root cause.
//
// No lock and no state: Investigate calls workers and must run without any lock held (on the
// coordinator's executor). Thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/workers/worker_client.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// A rank's report that its task failed.
struct ReportedFailure {
  int rank = 0;
  std::string worker_id;
  std::string error;
  int replica = 0;
};

// A rank whose task had not ended when another failed.
struct Peer {
  int rank = 0;
  std::string worker_id;
  std::string address;
  int replica = 0;
};

struct RootCause {
  // Lost peers first (in the order given), else the reporting rank with the action its error
  // names (e.g. "1RECV_F0").
  v1::JobFailure failure;
  // "worker w-3 (rank 2) lost: unreachable: ... (rank 1 reported: ...)", or
  // "rank 1 (worker w-2) failed: ...".
  std::string reason;
  // Peers that did not answer: (worker id, why), to mark lost in the registry.
  std::vector<std::pair<std::string, std::string>> lost;
};

class FailureInvestigation {
 public:
  // `workers` must outlive it; each probe is bounded by `probe_timeout`.
  FailureInvestigation(WorkerClient* workers, absl::Duration probe_timeout)
      : workers_(workers), probe_timeout_(probe_timeout) {}

  RootCause Investigate(const ReportedFailure& reported, const std::vector<Peer>& peers) const;

 private:
  WorkerClient* const workers_;
  const absl::Duration probe_timeout_;
};

// "worker w-3 (rank 2)".
std::string WorkerLabel(const std::string& worker_id, int rank, int replica = 0);

// "rank 1", or "rank 1 of replica 2" for a replica other than 0.
std::string RankLabel(int rank, int replica);

// The first action (PyTorch syntax, e.g. "1RECV_F0") a worker's error message names; empty
// when it names none.
std::string FailedAction(const std::string& error);

}  // namespace stagecoach::coordinator
