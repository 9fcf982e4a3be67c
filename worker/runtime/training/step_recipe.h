// The training recipe's decisions around each optimizer step (docs/training-recipe.md): the
// learning rate of the step (training.lr_schedule), the gradients' global norm and clipping
// (training.grad_clip), and skipping the step when any rank's gradients are not finite.
//
// Prepare runs on every rank of the job after the step's backward and replica reduction, before
// the optimizer step:
//   1. sets the optimizer's lr to LearningRateAt(global step) (common/spec/learning_rate.h);
//   2. takes this rank's share of the gradient statistics over the tensors its optimizer steps
//      (its stages' parameters, or its ZeRO shards, whose padding is zero): the sum of the
//      squares of each tensor's L2 norm (as clip_grad_norm_ takes each gradient's norm first),
//      and whether every gradient is finite (a sum that overflowed from finite values is not a
//      non-finite gradient: the step then goes on with an infinite norm, as in torch);
//   3. sums them over the job: over the data-parallel group first when the optimizer steps
//      shards (each replica holds 1/D of the reduced gradient; replicas without sharding hold
//      the same reduced gradients and need no sum), then over the pipeline's ranks
//      (job_reduction.h). Every rank of every replica gets the same bits;
//   4. decides: skip when some rank's gradients were not finite (naming those ranks); else with
//      grad_clip scale every gradient by max_norm / (norm + 1e-6) when that is below 1, the
//      coefficient torch.nn.utils.clip_grad_norm_ uses.
// The caller steps the optimizer unless the decision says skip (then AdamW's step count and
// SGD's momentum do not advance; the next step zeroes the gradients as usual).
//
// Not thread-safe: the task's thread, between steps (the reducer finished, the executor idle).
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "worker/collectives/collectives.h"
#include "worker/runtime/training/job_reduction.h"

namespace stagecoach::runtime {

struct RecipeDecision {
  double learning_rate = 0.0;
  // Global L2 norm of the gradients before clipping (set with training.grad_clip).
  std::optional<double> grad_norm;
  // Scale applied to every gradient (1 when not clipped).
  double clip_coefficient = 1.0;
  // Some rank's gradients were not finite: do not step the optimizer.
  bool skip = false;
  // The pipeline ranks whose gradients were not finite, ascending.
  std::vector<int> nonfinite_ranks;
};

struct StepRecipeOptions {
  spec::TrainingSpec training;
  // T: the job's planned timeline in global steps (TaskAssignment.timeline_steps).
  int64_t timeline_steps = 1;
  // This rank within its pipeline, and the pipeline's ranks.
  int rank = 0;
  int ranks = 1;
  // The data-parallel group, when the optimizer steps ZeRO shards (their statistics are summed
  // over it); null otherwise. Must outlive the recipe.
  collectives::Collectives* shard_group = nullptr;
  // The task's device: where a device-memory group (NCCL) takes the statistics.
  torch::Device device = torch::kCPU;
  absl::Duration timeout = absl::Seconds(60);
  // A parameter whose gradient the norm leaves out (the second copy of a tied weight, counted
  // once on the rank of its first copy); undefined for none. It is still clipped.
  torch::Tensor not_counted;
};

class StepRecipe {
 public:
  // `pipeline` must outlive the recipe.
  StepRecipe(StepRecipeOptions options, JobReduction* pipeline)
      : options_(std::move(options)), pipeline_(pipeline) {}

  // Steps 1-4 above for the step at `global_step`, on `optimizer`'s parameters' gradients. The
  // reductions' errors.
  absl::StatusOr<RecipeDecision> Prepare(int64_t global_step, torch::optim::Optimizer& optimizer);

  double LearningRateAt(int64_t global_step) const;

 private:
  // Sums `stats` over the data-parallel group (ZeRO shards), in device memory when the group
  // takes it.
  absl::Status SumOverShards(std::vector<double>& stats) const;

  const StepRecipeOptions options_;
  JobReduction* const pipeline_;
};

}  // namespace stagecoach::runtime
