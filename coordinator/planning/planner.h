// The planner turns a validated job spec into a plan: how the model's layers are partitioned
// into stages, which rank owns which stage, and each rank's lowered action list (the schedule
// IR with sends and receives), validated to be complete and deadlock-free. It needs no LibTorch:
// built-in model layers are known from the spec; a TorchScript model's layers (and profiled
// layer times) come from a worker's InspectModel.
//
// Partition. split.points maps a layer name to "beginning" (a stage boundary right before that
// layer) or "end" (right after it), as PyTorch's SplitPoint does. Without points, split.policy
// cuts the layers into the planned number of stages: equal-layers (layer counts differ by at
// most one), equal-params (minimise the largest stage's parameter count), profiled (minimise
// the largest stage's measured forward + backward time), memory (minimise the largest rank's
// predicted memory under the schedule) or fewer-first-last (equal layers, the first and last
// stage counting one layer more; memory_partition.h). Among equally good cuts, earlier stages
// take fewer layers. schedule.kind auto is not planned here: the plan search (plan_search.h)
// chooses a schedule and plans each candidate with PlanJob.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/schedule/action.h"
#include "common/schedule/generators.h"
#include "common/spec/job_spec.h"
#include "common/spec/spec_limits.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

struct StagePlan {
  int stage = 0;
  int first_layer = 0;  // index into the model's ordered layers
  int end_layer = 0;    // one past the last layer
  int64_t parameters = 0;
};

// What one pipeline rank is predicted to compute in a step, and how much of the step it idles.
struct PredictedRankTime {
  double compute = 0;  // seconds, or a share of the step's compute (Plan::predicted_in_seconds)
  double bubble_ratio = 0;
};

// What one pipeline rank is predicted to hold (memory_prediction.h), in bytes.
struct PredictedRankMemory {
  int64_t static_bytes = 0;  // parameters, gradients, optimizer state
  int64_t peak_bytes = 0;    // the most activation and buffer bytes live at once in a step
  std::string peak_action;   // during which it happens, e.g. "0F3"
};

struct Plan {
  // The model's ordered layers the plan partitions (names, parameters, profiled times when
  // measured); StagePlan layer indices point into it.
  std::vector<v1::LayerInfo> layers;
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
  // Data-parallel replicas of the pipeline (placement.replicas): the job has num_tasks() tasks,
  // task replica * num_ranks + rank holding `rank` of replica `replica`. The D tasks of one rank
  // form that rank's data-parallel group.
  int replicas = 1;
  // What the replicas shard (placement.shard; kNone with one replica): the time model counts
  // its collectives (plan_costs.h).
  spec::ShardLevel shard = spec::ShardLevel::kNone;
  // Indexed by rank: the memory model's prediction when the layers carry measured sizes (a
  // profiled InspectModel), else empty.
  std::vector<PredictedRankMemory> predicted_memory;
  // How `stages` were cut: the split.policy, "points" (split.points) or "recorded"
  // (PlanOptions::stage_first_layers); admission appends why when it chose a default policy.
  std::string split;
  // Indexed by rank: the compute and bubble ratio the schedule simulator predicts
  // (PredictRankTimes, plan_costs.h); `predicted_in_seconds` says whether compute is in seconds
  // or a share of the step's compute.
  std::vector<PredictedRankTime> predicted_ranks;
  bool predicted_in_seconds = false;

  int num_tasks() const { return num_ranks * replicas; }
  int TaskIndex(int replica, int rank) const { return replica * num_ranks + rank; }
};

// Whether planning `spec` needs a worker's InspectModel: a TorchScript model (its layers are
// only known from the file) or a profile (NeedsProfile).
bool NeedsInspection(const spec::JobSpec& spec);
// Whether that inspection must profile the layers (times and sizes): split.policy profiled or
// memory without split.points, schedule.kind auto, or a placement.memory_limit.
bool NeedsProfile(const spec::JobSpec& spec);

struct PlanOptions {
  // The job's batches come from the client (an Infer job), not from the spec's data section:
  // the checks that the data can feed the model do not apply.
  bool client_batches = false;
  // Admission limits (spec::CheckSpecLimits checks the spec itself before planning); PlanJob
  // enforces those only the plan knows: the layers it is given, the stages a schedule derives
  // from placement.workers, and the actions of the schedule (bounded by 8 x stages x
  // microbatches before it is built).
  spec::SpecLimits limits;
  // Planning gives up with DEADLINE_EXCEEDED once past `deadline`, and with CANCELLED once
  // `cancelled` (when set) returns true (its client went away); checked between its phases and
  // between the stages of the split search.
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled;
  // A recorded plan's partition (each stage's first layer), used instead of split.points and
  // split.policy: a recovered job keeps the stages its checkpoints were written with, and no
  // split search runs. INVALID_ARGUMENT when it does not fit the layers and the schedule.
  std::vector<int> stage_first_layers;

  // OK, or why planning must stop now; `phase` says where it was ("splitting the layers").
  absl::Status Interrupted(absl::string_view phase) const;
};

// The checks PlanJob makes of the spec alone (model family, data kind and path, loss) before it
// needs the model's layers; callers run it before asking a worker to inspect the model.
// INVALID_ARGUMENT naming the field.
absl::Status CheckPlannable(const spec::JobSpec& spec, const PlanOptions& options = {});

// Plans `spec` over the model's ordered `layers` (BuiltinLayers for a built-in model, or a
// worker's InspectModel; layers[i].forward/backward_seconds are needed by split.policy
// profiled). INVALID_ARGUMENT naming the spec field for what cannot be planned: an unknown
// schedule, a schedule constraint (e.g. 1F1B with fewer microbatches than stages), more stages
// than layers, a stage count that does not fit the workers, a placement.style the schedule's
// action lists do not follow, a schedule file that is invalid ("schedule.csv: FILE line L
// (rank r), column C (step c): ..."), a split point naming no layer (the message lists the
// valid names), split points that make an empty stage, share a boundary or make another stage
// count than split.stages, profiled without measured times, or data the model cannot take.
absl::StatusOr<Plan> PlanJob(const spec::JobSpec& spec, std::vector<v1::LayerInfo> layers,
                             const PlanOptions& options = {});

// Plans a built-in model from its spec alone: PlanJob(spec, BuiltinLayers(...)).
// INVALID_ARGUMENT for a TorchScript model or split.policy profiled, which need a worker's
// InspectModel.
absl::StatusOr<Plan> PlanJob(const spec::JobSpec& spec);

// Parameter count of each layer of a built-in model, in layer order
// (spec::BuiltinLayerParameterCounts; empty for a model whose counts overflow, which admission
// refuses).
std::vector<int64_t> BuiltinLayerParameters(const spec::BuiltinModel& model);

// The layers of a built-in model: names (spec::BuiltinLayerNames) and parameter counts, no
// times.
std::vector<v1::LayerInfo> BuiltinLayers(const spec::BuiltinModel& model);

// The first layer of each stage that `points` (layer name -> "beginning" | "end") make over
// `layers`, starting with 0. A point may name a layer, or a module that holds a contiguous run
// of layers (a module whose calls the worker opened: "encoder.layers" for the layers
// "encoder.layers.0" ... "encoder.layers.11"), whose beginning is its first layer's and whose
// end is its last's. INVALID_ARGUMENT naming split.points: a name that is no layer and holds
// none (listing the valid names), a module whose layers are not contiguous, a point that makes
// an empty stage (beginning of the first layer, end of the last), or two points at one boundary
// (naming both).
absl::StatusOr<std::vector<int>> SplitPointsToFirstLayers(
    const std::map<std::string, std::string>& points, const std::vector<v1::LayerInfo>& layers);

// Contiguous partition of `layer_costs` (non-negative) into `stages` non-empty parts that
// minimises the most expensive part (ties: earlier stages take fewer layers, since under 1F1B
// they hold more microbatches in flight). Returns the first layer of each part. Requires
// 1 <= stages <= layer_costs.size(). O(stages^2 x log(layers) x log(total cost)) time, O(layers)
// memory. With `options`, gives up between stages as PlanOptions::Interrupted says.
absl::StatusOr<std::vector<int>> PartitionBalanced(const std::vector<int64_t>& layer_costs,
                                                   int stages, const PlanOptions& options);
std::vector<int> PartitionBalanced(const std::vector<int64_t>& layer_costs, int stages);

}  // namespace stagecoach::coordinator
