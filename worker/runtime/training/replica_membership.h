// A task's place among its job's data-parallel replicas when they carry on without a lost one
// (TaskAssignment.settle_steps; docs/recovery.md has the whole design).
//
// Every training step is settled with the coordinator (CoordinatorService.SettleStep) between
// its gradient reduction and its optimizer step: COMMIT lets the optimizer step; RETRY says a
// replica was lost, so the step is abandoned (the caller undoes it: step_rollback.h), the
// data-parallel group is re-formed without it (the Regroup callback: a new group of the healthy
// replicas, rendezvousing under the attempt's prefix + "dp/e<epoch>/<rank>/") and the step runs
// again with the slices of the global batch this replica now runs; STOP ends the task. A step
// that failed in the data-parallel group settles with its error and waits for that answer.
//
// Slices: slice s of a step's global batch is the M microbatches replica s runs when every
// replica is healthy; the replica starts with its own ([replica]). A replica running k slices
// accumulates their gradients, and its reduction sums over the group and divides by the
// replica count D, so the step's gradient is the mean over the whole global batch as before.
//
// Healing: a COMMIT whose membership is a later epoch takes a healed replica back in from the
// next step (join_global_step): the task applies the committed step, then, before the next,
// ApplyPending re-forms the group with every member and the donor's state transfer
// (replica_sync.h). A replacement rank (TaskAssignment.join) calls Join after its set-up: it
// waits for the JOIN answer, re-forms the group the same way and receives the state.
//
// Every call is bounded: each SettleStep by `poll`, the whole settling of a step by `timeout`
// (DEADLINE_EXCEEDED naming the step); an unreachable coordinator is asked again until then.
// Not thread-safe: the task's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stagecoach/v1/coordinator.pb.h"

namespace stagecoach::runtime {

// CoordinatorService.SettleStep, bounded by the request's wait plus a margin.
using StepSettler =
    std::function<absl::StatusOr<v1::SettleStepResponse>(const v1::SettleStepRequest& request)>;

// A new membership for the task's data-parallel group.
struct MembershipChange {
  int epoch = 0;
  // This replica's rank among the group_size healthy ones.
  int group_rank = 0;
  int group_size = 1;
  // When the membership takes a healed replica in: the group rank that sends every member its
  // state (replica_sync.h) before global step `join_step`; -1 otherwise.
  int donor = -1;
  int64_t join_step = -1;
};

// Re-forms the task's data-parallel group for `change` (and syncs the state from its donor).
// The group's errors.
using Regroup = std::function<absl::Status(const MembershipChange& change)>;

struct MembershipOptions {
  std::string worker_id;
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  int replica = 0;
  int replicas = 1;
  // Bound on settling one step (waiting for the other ranks, a lost worker's lease, the
  // coordinator's decision), and on each SettleStep call.
  absl::Duration timeout = absl::Seconds(60);
  absl::Duration poll = absl::Seconds(10);
  // Bound on a replacement's wait to join (its replica's other ranks, a committed step).
  absl::Duration join_timeout = absl::Hours(24);
};

// Where a replacement joins (Join): the global step, and the job's step control then.
struct JoinPoint {
  int64_t global_step = 0;
  int64_t step_limit = 0;
  bool finish_at_limit = false;
};

class ReplicaMembership {
 public:
  ReplicaMembership(MembershipOptions options, StepSettler settle, Regroup regroup);

  int epoch() const { return epoch_; }
  // The slices this replica runs, ascending; and the replica count D they are slices of.
  const std::vector<int>& slices() const { return slices_; }
  int replicas() const { return options_.replicas; }
  // This replica's index in the data-parallel group (0: it runs slice 0 and writes checkpoints).
  int group_rank() const { return group_rank_; }

  enum class Outcome { kCommit, kRetry };
  // Settles the step the task counts as `step` (the timeline's `global_step` steps before it).
  // `failure`: OK when its reduction succeeded, else the group's error. `losses`: the last
  // stage's microbatch losses of the slices it ran (slice by slice), empty elsewhere. kRetry
  // after the group was re-formed (see the file comment). STOP: ABORTED with the coordinator's
  // reason (and `failure`'s message); the Regroup's errors; DEADLINE_EXCEEDED.
  absl::StatusOr<Outcome> Settle(int64_t step, int64_t global_step, const absl::Status& failure,
                                 const std::vector<double>& losses);

  // A committed step brought a membership that takes a healed replica in before the next step.
  bool HasPending() const { return pending_.has_value(); }
  // Adopts it: the group re-formed with every member and the state synced (Regroup's errors).
  absl::Status ApplyPending();

  // A replacement rank, set up: waits for its replica to rejoin (SettleStepRequest.joining),
  // adopts the membership (the group re-formed, the state received from the donor) and
  // returns where it joins. STOP: ABORTED with the coordinator's reason; DEADLINE_EXCEEDED
  // after join_timeout; Regroup's errors.
  absl::StatusOr<JoinPoint> Join();

 private:
  // Takes `response`'s membership and calls Regroup (with the donor when it names one).
  absl::Status Adopt(const v1::SettleStepResponse& response);
  // One SettleStep with the task's identity and `request`'s fields, retried on RPC errors until
  // `deadline`; the last error after it.
  absl::StatusOr<v1::SettleStepResponse> Ask(v1::SettleStepRequest request, absl::Time deadline);

  const MembershipOptions options_;
  const StepSettler settle_;
  const Regroup regroup_;
  int epoch_ = 0;
  int group_rank_ = 0;
  std::vector<int> slices_;
  std::optional<v1::SettleStepResponse> pending_;
};

}  // namespace stagecoach::runtime
