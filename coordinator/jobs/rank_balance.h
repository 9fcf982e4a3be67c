// What each pipeline rank of a job does in a step, for GetJob's `balance` (RankBalance) and
// `stagectl plan --job`: the plan's prediction (Plan::predicted_ranks) beside the latest step
// every rank traced, and that step replayed through the schedule simulator with the costs its
// actions measured.
//
// The replay: each stage's F, B, I and W cost the mean of what those actions measured in the
// step (end - start - wait: their own work, not their waits for data), and messages cost
// nothing. An OVERLAP_F_B's own time is shared among its parts in the proportion of their
// separate means; a part never measured apart weighs F 1, B 2, I 1, W 1 times its stage's (or
// else the other stages') measured unit. What the replay
// leaves a rank idle is what the schedule and the split make it wait for; the measured bubble
// adds what the messages and the runtime themselves cost.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/jobs/step_trace.h"
#include "coordinator/planning/planner.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// One traced step's figures per pipeline rank (indexed by rank).
struct MeasuredBalance {
  int64_t step = -1;                      // global step; -1: none
  std::vector<double> compute_seconds;    // the rank's F, B, I, W own time
  std::vector<double> measured_bubble;    // as the rank reported it
  std::vector<double> simulated_bubble;   // the replay's
};

// The replay of one step from its ranks' reports (`ranks`: task index -> report; replica 0's
// ranks 0..plan.num_ranks-1 are used). FAILED_PRECONDITION for a plan without action lists (one
// rebuilt from a record, not planned again yet); NOT_FOUND when one of them is missing;
// INVALID_ARGUMENT
// naming the rank and action when an action does not parse or its timing is missing, or the
// simulator refuses the plan's lists.
absl::StatusOr<MeasuredBalance> ReplayStep(const Plan& plan, int64_t step,
                                           const std::map<int, RankStepTiming>& ranks);

// Job.balance, predicted_compute_in_seconds and balance_step from the plan's prediction and
// `measured` (its step -1: predictions only).
void BalanceToProto(const Plan& plan, const MeasuredBalance& measured, v1::Job* out);

}  // namespace stagecoach::coordinator
