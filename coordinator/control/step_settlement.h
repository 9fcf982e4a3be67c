// Step settlement for jobs whose replicas carry on (CoordinatorService.SettleStep;
// coordinator/jobs/replica_health.h states the rules, docs/recovery.md the whole design).
//
// Each rank of a healthy replica asks between its gradient reduction and its optimizer step.
// The call records the arrival in the job's ReplicaHealth and waits, on the job table's lock's
// condition (so no thread is busy meanwhile), until the step is committed (COMMIT), the
// membership moved on (RETRY with the rank's new group and slices), the job stopped, restarted
// or left the rank's replica out (STOP), or the request's wait ran out (WAIT: the rank asks
// again). The last stage's losses of a committed step go to step aggregation at once, so a
// replica lost after the commit costs no loss of the record. A rank that arrives with `failed`
// has its peers probed (JobLifecycle::SettleFailedLocked).
//
// Joining: a replacement rank of a replica being healed (TaskAssignment.join) asks with
// `joining` once it has set up; the call waits until every rank of that replica asked and the
// healthy ones committed a step, then answers JOIN: the new membership, the step it joins at,
// the donor replica and the job's step control.
//
// Thread-safe; takes the job table's lock (and waits on it).
#pragma once

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/util/clock.h"
#include "coordinator/control/step_aggregation.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/lifecycle/job_lifecycle.h"
#include "stagecoach/v1/coordinator.pb.h"

namespace stagecoach::coordinator {

struct StepSettlementDeps {
  JobTable* table = nullptr;
  JobLifecycle* lifecycle = nullptr;
  Clock* clock = nullptr;
};

class StepSettlement {
 public:
  // Longest one call waits when the request asks for more (or for nothing).
  static constexpr absl::Duration kMaxWait = absl::Seconds(30);

  explicit StepSettlement(StepSettlementDeps deps) : deps_(deps) {}

  // See the file comment. NOT_FOUND for an unknown job; FAILED_PRECONDITION for a rank not of
  // the job's current placement or a job that does not carry on; INVALID_ARGUMENT naming the
  // field for a negative step or epoch.
  absl::StatusOr<v1::SettleStepResponse> Settle(const v1::SettleStepRequest& req);

 private:
  // A replacement rank asks to join (SettleStepRequest.joining): JOIN once its replica rejoined,
  // STOP when its healing was abandoned or the job stopped, WAIT after `wait`. With the job
  // table's lock held (it waits on it).
  absl::StatusOr<v1::SettleStepResponse> Join(Job& job, const v1::SettleStepRequest& req,
                                              absl::Duration wait);
  // The JOIN answer for `replica` of `job`: the membership, the join step and donor, and the
  // job's step control.
  static v1::SettleStepResponse Joined(const Job& job, int replica);

  const StepSettlementDeps deps_;
};

}  // namespace stagecoach::coordinator
