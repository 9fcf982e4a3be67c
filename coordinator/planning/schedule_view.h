// What GetJobSchedule shows of a job's plan: per rank its stages, its compute actions and the
// lowered list it runs (PyTorch syntax), and both as text grids (schedule::FormatGrid). Pure
// function of the plan; thread-safe.
#pragma once

#include "coordinator/planning/planner.h"
#include "stagecoach/v1/coordinator.pb.h"

namespace stagecoach::coordinator {

// The schedule of `plan` as GetJobSchedule returns it: schedule (plan.schedule_name),
// num_stages, num_ranks, microbatches; ranks[r] with r's stages (ascending, from
// plan.stage_to_rank), its compute actions (the IsCompute entries of plan.lowered[r]: F, I, B,
// W, OVERLAP_F_B, in order) and its lowered actions (plan.lowered[r] without idle slots); grid
// = FormatGrid of the compute lists, lowered_grid = FormatGrid of the lowered lists. The
// response holds no job id: the caller's request names it.
v1::GetJobScheduleResponse ScheduleView(const Plan& plan);

}  // namespace stagecoach::coordinator
