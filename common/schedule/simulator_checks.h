// Simulate's checks of its inputs (simulator.cc): the lowered lists' shape against the placement,
// the cost model, and every action's range, placement and peer. Not for other callers.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/schedule/action.h"
#include "common/schedule/simulator.h"

namespace stagecoach::schedule::simulator_internal {

// INVALID_ARGUMENT "rank <rank>, step <step>: <what>".
absl::Status AtStep(size_t rank, size_t step, absl::string_view what);

// One row per rank, stage_to_rank of num_stages ranks among them, counts positive.
absl::Status CheckShape(const PipelineOrder& lowered, const std::vector<int>& stage_to_rank,
                        int num_stages, int num_microbatches);

// Every cost finite and non-negative, per-stage vectors of num_stages entries.
absl::Status CheckCostModel(const CostModel& costs, int num_stages);

// Every action's ranges and placement, and for SEND/RECV a peer stage on another rank.
absl::Status CheckActions(const PipelineOrder& lowered, const std::vector<int>& stage_to_rank,
                          int num_microbatches);

}  // namespace stagecoach::schedule::simulator_internal
