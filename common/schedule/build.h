// The whole path from a schedule config to what the ranks execute: generate, place stages, lower
// and validate. The coordinator's planner and `stagectl schedule` both go through it.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/action.h"
#include "common/schedule/generators.h"
#include "common/schedule/lowering.h"

namespace stagecoach::schedule {

struct BuiltSchedule {
  // GenerateSchedule(config): PyTorch's pipeline_order.
  PipelineOrder compute;
  // StageToRank in the kind's DefaultMappingStyle.
  std::vector<int> stage_to_rank;
  // LowerSchedule(compute, ...): what each rank executes.
  PipelineOrder lowered;
};

// Generates `config`'s schedule, places its stages, lowers it with `lowering` and validates both
// lists (without backward for forward-only kinds). A config the kind refuses returns the
// generator's INVALID_ARGUMENT error unchanged; a list that fails lowering or validation is a
// library bug and returns INTERNAL naming the schedule.
absl::StatusOr<BuiltSchedule> BuildSchedule(const ScheduleConfig& config,
                                            const LoweringOptions& lowering = {});

}  // namespace stagecoach::schedule
