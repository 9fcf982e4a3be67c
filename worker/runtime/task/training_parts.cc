#include "worker/runtime/task/training_parts.h"

#include <vector>

#include "common/rpc/time_conversion.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {

absl::StatusOr<TrainingParts> MakeTrainingParts(const v1::TaskAssignment& task,
                                                const TaskSetup& setup,
                                                transport::Transport& transport,
                                                collectives::Collectives* group) {
  TrainingParts parts;
  const absl::Duration timeout = rpc::FromProtoDuration(task.comm_timeout());
  // A replacement rank (task.join) gets its group when it joins (GradientReducer::SetGroup).
  if (group != nullptr || (task.has_join() && !setup.forward_only)) {
    GradientReductionOptions options;
    options.overlap = setup.spec.placement.overlap_reduction;
    options.timeout = timeout;
    options.shards = setup.shards.get();
    parts.comm = std::make_unique<WorkQueue>(1);
    parts.reducer =
        std::make_unique<GradientReducer>(options, group, setup.stages->by_index, parts.comm.get());
    if (group != nullptr && setup.shards != nullptr &&
        setup.shards->level() == spec::ShardLevel::kParameters) {
      // From here on the stages' parameters are released until their first UNSHARD.
      parts.gathering = std::make_unique<ParameterGathering>(setup.shards.get(), group,
                                                             parts.comm.get(), timeout);
    }
  }
  if (setup.forward_only) return parts;
  if (const std::optional<TiedPair> pair = TiedPairOf(setup.spec, task.num_stages())) {
    const std::vector<int> stage_to_rank(task.stage_to_rank().begin(), task.stage_to_rank().end());
    ASSIGN_OR_RETURN(
        parts.tied, TiedGradients::Create(*pair, stage_to_rank, task.rank(), setup.stages->by_index,
                                          &transport, setup.device, timeout));
  }
  StepRecipeOptions options;
  options.training = setup.spec.training;
  options.timeline_steps = task.timeline_steps() > 0 ? task.timeline_steps() : task.step_limit();
  options.rank = task.rank();
  options.ranks = task.world_size();
  options.shard_group = setup.shards != nullptr ? group : nullptr;
  options.device = setup.device;
  options.timeout = timeout;
  if (parts.tied != nullptr) options.not_counted = parts.tied->not_counted();
  parts.job_reduction = std::make_unique<JobReduction>(&transport, setup.device, timeout);
  parts.recipe = std::make_unique<StepRecipe>(std::move(options), parts.job_reduction.get());
  return parts;
}

}  // namespace stagecoach::runtime
