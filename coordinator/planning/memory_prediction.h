// The memory each pipeline rank of a plan will hold, predicted by the schedule library's memory
// model (common/schedule/memory_model.h) from the model's measured layer sizes
// (LayerInfo.activation_bytes and output_bytes, which a worker's InspectModel profile measures
// on CPU) and the job's recipe. The planner attaches it to the plan; `stagectl status` and the
// coordinator's metrics show it next to what the workers measure. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/memory_model.h"
#include "common/schedule/simulator.h"
#include "common/spec/job_spec.h"
#include "coordinator/planning/planner.h"

namespace stagecoach::coordinator {

// Per stage of `plan`, in bytes:
//  - parameters and gradients: 4 bytes per parameter each (fp32, bf16 jobs included: their
//    master weights are fp32). With replicas and placement.shard (c: 4 bytes per parameter of
//    one replica's padded shard): optimizer and gradients add the optimizer's shard and its
//    gradient (2c, static); parameters keeps only those as static bytes and gathers the whole
//    (replicas x c) from each UNSHARD to its RESHARD; from gradients on, the gradients are freed
//    at the stage's REDUCE_GRAD. The reduce-scatter's flat copy of a stage's gradients (while
//    it runs on the communication thread) is not counted;
//  - optimizer state: schedule::OptimizerStateBytes for training.optimizer (SGD with momentum
//    keeps one buffer, AdamW two), divided over the replicas with placement.shard: optimizer
//    or more;
//  - activations: the sum of its layers' activation_bytes; with activation_checkpointing full,
//    only its output (it keeps its inputs, counted as receive buffers) and the rest as the
//    backward's transient (rebuilt by the recomputation);
//  - weight_activations and weight_gradients (a split backward, from I to W): what the profile
//    measured live between I and W (the sum of its layers' weight_pending_bytes, less the
//    stage's input, which the model keeps as a receive buffer until W), of which up to its
//    activations count as weight_activations and the rest as weight_gradients. Without that
//    measurement (or with recomputation): weight_activations are the activations minus the
//    output (a weight gradient needs every saved input of the stage's weight products) and
//    weight_gradients the sum of its layers' output_bytes;
//  - forward transient: the most any of its layers' forward allocates beyond what it keeps
//    (forward_transient_bytes);
//  - backward transient: the most any of its layers' backward allocates
//    (backward_transient_bytes) beyond the gradient of its input (the model counts the stage's
//    input gradient apart), plus with recomputation the activations it rebuilds;
//  - weight transient: the most any of its layers' W allocated in the profile
//    (weight_transient_bytes: a weight gradient computed straight into .grad adds none, a
//    bias's is computed apart); without that measurement its largest layer's parameter bytes
//    (that layer's weight gradients, computed before they are accumulated);
//  - output: its last layer's output_bytes.
// The layer sizes are those of the profile: fp32 (a bf16 job keeps less).
// gradient_sends_held_to_step_end is not set: the worker's executor frees a gradient send once
// the transport finished it (worker/runtime/executor/pipeline_executor.h, ReleaseFinishedSends).
schedule::MemoryModel StageMemoryModel(const spec::JobSpec& spec, const Plan& plan);

// Simulates `plan`'s lowered lists (PlanCostModel with DefaultCostAssumptions: the layers'
// profiled times, or F 1, B 2, I 1, W 1 without them) and returns each pipeline rank's
// prediction; empty when no layer carries a measured size (nothing to predict from) and for
// forward-only plans. INTERNAL if the plan cannot be simulated.
absl::StatusOr<std::vector<PredictedRankMemory>> PredictMemory(const spec::JobSpec& spec,
                                                               const Plan& plan);

// The same from `simulation`, a Simulate run of `plan`'s lowered lists.
absl::StatusOr<std::vector<PredictedRankMemory>> PredictMemory(
    const spec::JobSpec& spec, const Plan& plan, const schedule::Simulation& simulation);

// Whether any of `layers` (of `plan`) carries a measured size (activation or output bytes).
bool HasMeasuredSizes(const std::vector<v1::LayerInfo>& layers);
bool HasMeasuredSizes(const Plan& plan);

}  // namespace stagecoach::coordinator
