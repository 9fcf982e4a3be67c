// How `stagectl plan` shows the coordinator's plan search (PlanSpecResponse), and how `status`
// shows the plan an auto job was given (Job.plan_choice). Pure functions.
#pragma once

#include <string>

#include "nlohmann/json.hpp"
#include "stagecoach/v1/coordinator.pb.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::client {

// A ranked table of the first `top` candidates (RANK, SCHEDULE, STAGES/WORKER, MICROBATCHES,
// SPLIT, STEP, BUBBLE, PEAK, FITS), under a line saying how many were searched and fit and
// the limit; "(N more: -o json lists all)" when some are left out; then the first plan's
// predicted compute and bubble per rank. Ends with "\n".
std::string PlanTable(const v1::PlanSpecResponse& plans, int top);

// {memory_limit_bytes, profiled_by, candidates: [CandidateJson...], layers: [{name,
// parameters, forward_seconds, backward_seconds, backward_input_seconds,
// backward_weight_seconds, activation_bytes, output_bytes}]}.
nlohmann::json PlanJson(const v1::PlanSpecResponse& plans);

// {schedule, stages_per_rank, num_stages, microbatches, split_policy, step_seconds, bubble,
// rank_peak_bytes, max_peak_bytes, fits, stage_first_layers, rank_compute_seconds,
// rank_bubble_ratios}.
nlohmann::json CandidateJson(const v1::PlanCandidate& candidate);

// Two lines for `status`: "Plan:      chosen by a search of N plans (M fit L): <chosen>" and
// "Runner-up: <runner-up>", each with its predicted step, bubble and peak. Empty when the job has
// no plan_choice.
std::string PlanChoiceText(const v1::Job& job);

// Job.plan_choice as JSON ({chosen, runner_up, candidates, fitting, memory_limit_bytes}), or
// null when the job has none.
nlohmann::json PlanChoiceJson(const v1::Job& job);

}  // namespace stagecoach::client
