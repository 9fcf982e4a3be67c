// How `stagectl status`, `stagectl plan --job` and `stagectl watch` show how a job's work falls
// on its pipeline ranks: a step's bubble as its mean over the ranks and its worst rank, and the
// per-rank table of Job.balance (the plan's predicted compute and bubble beside the latest
// traced step's measured compute and bubble, and the bubble the schedule simulator gives that
// step's measured costs). Pure functions.
#pragma once

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::client {

// "0.123 mean, 0.201 worst (rank 1)" from a step's ratios by task (replica * num_ranks + rank;
// "replica 1 rank 0" when num_ranks > 0 and the task is past the first replica). "" when empty.
std::string BubbleSummary(const std::vector<double>& ratios, int num_ranks = 0);

// The `status` lines on how the job is split and balanced: "Split:     <Job.split>" and, once a
// step was traced, "Bubble:    <BubbleSummary of its ranks> in global step N"; the worst step of
// the history shown follows ("; worst step shown 0.314 (on its worst rank)"). Each line ends with
// "\n"; empty for a job with none of it.
std::string BalanceLines(const v1::Job& job);

// RANK, STAGES, PREDICTED COMPUTE, PREDICTED BUBBLE, then (once a step was traced) MEASURED
// COMPUTE, MEASURED BUBBLE and SIMULATED BUBBLE. Compute is in ms, or a percentage of the
// step's compute when the plan had no profiled times. Empty when the job has no balance.
std::string BalanceTable(const v1::Job& job);

// {split, predicted_compute_in_seconds, balance_step, ranks: [{rank, stages, predicted_compute,
// predicted_bubble_ratio, measured_compute_seconds, measured_bubble_ratio,
// simulated_bubble_ratio}]}.
nlohmann::json BalanceJson(const v1::Job& job);

}  // namespace stagecoach::client
