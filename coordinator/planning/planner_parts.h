// Parts of the planner (planner.h) shared by its files: planner.cc (partition, generated
// schedules, the plan) and plan_file_schedule.cc (schedule.csv). Internal to the planner.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/spec/job_spec.h"
#include "coordinator/planning/planner.h"

namespace stagecoach::coordinator::planning {

// INVALID_ARGUMENT "<field>: <why>".
absl::Status FieldError(absl::string_view field, absl::string_view why);

// The window of AddUnshardReshard for the spec's lists (schedule::UnshardWindow of
// placement.unshard) when its stages keep their parameters sharded (spec::ShardsParameters), else
// 0: no UNSHARD/RESHARD.
int UnshardWindowOf(const spec::JobSpec& spec, int num_stages);

// How many stages the spec asks for, and which field says so (for errors): split.stages, or
// the stages split.points make. 0 when neither says (placement.workers or the schedule decide).
struct StageRequest {
  int stages = 0;
  std::string field = "split.stages";
  bool from_points() const { return field == "split.points"; }
};

// Checks placement.style, when given, against `stage_to_rank`, the placement the action lists
// run (a generator's lists are written for one placement; a file's rows say where each stage
// runs). `lists` names the lists ("ZBVZeroBubble's action lists", "the rows of 'my.csv'"); `row`
// says where a rank's list is ("" or " (line 2)").
absl::Status CheckStyle(const spec::PlacementSpec& placement, const std::vector<int>& stage_to_rank,
                        int num_ranks, absl::string_view lists,
                        const std::function<std::string(int)>& row);

// The stages that begin at `firsts` (each stage's first layer, ascending, starting at 0) over
// `layers`, with their parameter counts.
std::vector<StagePlan> StagesFor(const std::vector<int>& firsts,
                                 const std::vector<v1::LayerInfo>& layers);

// schedule.csv: the file's lists (schedule.csv_text), checked against the spec, lowered if
// compute_only, validated; stage placement and worker count come from the file's rows. Fills
// `plan`'s schedule, stages, ranks and lowered lists. INVALID_ARGUMENT naming the field (and the
// file's line and column).
absl::Status PlanFileSchedule(const spec::JobSpec& spec, const StageRequest& request,
                              int64_t layers, Plan* plan);

}  // namespace stagecoach::coordinator::planning
