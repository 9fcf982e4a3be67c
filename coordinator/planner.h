// The planner turns a validated job spec into a plan: how the model's layers are partitioned
// into stages, which rank owns which stage, and each rank's lowered action list (the schedule
// IR with sends and receives), validated to be complete and deadlock-free. It needs no LibTorch:
// built-in model layers are known from the spec.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/action.h"
#include "common/schedule/generators.h"
#include "common/spec/job_spec.h"

namespace stagecoach::coordinator {

struct StagePlan {
  int stage = 0;
  int first_layer = 0;  // index into the model's ordered layers
  int end_layer = 0;    // one past the last layer
  int64_t parameters = 0;
};

struct Plan {
  // schedule.kind; for schedule.csv the generator whose action lists equal the file's (a PyTorch
  // dump), else kForwardOnly for a file without backward, else kGPipe as a placeholder:
  // `schedule_name` and `has_backward` describe a file.
  schedule::ScheduleKind kind = schedule::ScheduleKind::kGPipe;
  // What to show for the schedule: the generator's name ("ZBVZeroBubble"), or "csv:FILE" with
  // FILE as schedule.csv gives it.
  std::string schedule_name;
  // False for ForwardOnly and for a schedule file without B, I or W.
  bool has_backward = true;
  int num_stages = 0;
  int num_ranks = 0;
  // num_stages / num_ranks; for a file whose ranks hold different numbers of stages, the most
  // any rank holds.
  int stages_per_rank = 1;
  int num_microbatches = 0;
  std::vector<StagePlan> stages;    // indexed by stage
  std::vector<int> stage_to_rank;   // indexed by stage
  schedule::PipelineOrder lowered;  // indexed by rank; no idle slots
  // Data-plane transport the workers use: "gloo" or "nccl" (placement.transport, auto resolved).
  std::string transport = "gloo";
};

// Plans `spec`. INVALID_ARGUMENT naming the spec field for what cannot be planned: an unknown
// schedule, a schedule constraint (e.g. 1F1B with fewer microbatches than stages), more stages
// than layers, a stage count that does not fit the workers, a placement.style the schedule's
// action lists do not follow, a schedule file that is invalid ("schedule.csv: FILE line L
// (rank r), column C (step c): ..."), or a feature this coordinator does not support yet.
absl::StatusOr<Plan> PlanJob(const spec::JobSpec& spec);

// Parameter count of each layer of a built-in model, in layer order.
std::vector<int64_t> BuiltinLayerParameters(const spec::BuiltinModel& model);

// Contiguous partition of `layer_costs` into `stages` non-empty parts that minimises the most
// expensive part (ties: earlier stages take fewer layers,
// since under 1F1B they hold more microbatches in flight). Returns the first layer of each part.
// Requires 1 <= stages <= layer_costs.size().
std::vector<int> PartitionBalanced(const std::vector<int64_t>& layer_costs, int stages);

}  // namespace stagecoach::coordinator
