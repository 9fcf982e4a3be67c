// The parts of a task that act between its executor's step and its optimizer step, built once
// per task: the gradient reduction across data-parallel replicas (with its communication
// thread), the tied-embedding gradients' sum between the first and last stages, and the
// training recipe (learning rate, global norm, clipping, skipping) with its job-wide reduction.
// DataSteps::RunCounted uses them in that order.
//
// Members are destroyed in reverse order: the reducer and the gathering before their
// communication thread.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/util/work_queue.h"
#include "stagecoach/v1/types.pb.h"
#include "worker/collectives/collectives.h"
#include "worker/runtime/sharding/parameter_gathering.h"
#include "worker/runtime/task/task_setup.h"
#include "worker/runtime/training/gradient_reduction.h"
#include "worker/runtime/training/job_reduction.h"
#include "worker/runtime/training/step_recipe.h"
#include "worker/runtime/training/tied_parameters.h"
#include "worker/transport/transport.h"

namespace stagecoach::runtime {

struct TrainingParts {
  // With replicas (`group` given): the reduction of the rank's stages' gradients.
  std::unique_ptr<WorkQueue> comm;
  std::unique_ptr<GradientReducer> reducer;
  // placement.shard: parameters with replicas: the stages' parameters gathered at UNSHARD and
  // released at RESHARD, on the reducer's communication thread. Null otherwise.
  std::unique_ptr<ParameterGathering> gathering;
  // Training tasks: the job reduction on the pipeline's transport, the tied copies' sum (when
  // this rank holds one), the recipe. Null for forward-only tasks.
  std::unique_ptr<JobReduction> job_reduction;
  std::unique_ptr<TiedGradients> tied;
  std::unique_ptr<StepRecipe> recipe;
};

// `transport` and `group` (the data-parallel group, or null) must outlive the parts. A
// replacement rank (TaskAssignment.join) gets a reducer without a group yet.
// TiedGradients::Create's errors.
absl::StatusOr<TrainingParts> MakeTrainingParts(const v1::TaskAssignment& task,
                                                const TaskSetup& setup,
                                                transport::Transport& transport,
                                                collectives::Collectives* group);

}  // namespace stagecoach::runtime
