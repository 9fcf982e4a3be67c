// ZeRO's shards (placement.shard: optimizer, gradients, parameters) of one rank's stages, with D
// data-parallel replicas.
//
// Each stage's parameters, flattened in their order (N elements, one floating dtype), are padded
// with zeros to P = D * c elements; replica k owns elements [k*c, (k+1)*c): its shard. The
// optimizer steps one leaf tensor per stage, the shard (c elements), so it keeps 1/D of the
// stage's optimizer state. A step:
//   1. the stage's gradients, flattened and padded (FlatGradients), are reduce-scattered with
//      ReduceOp::kMean (GradientReducer does it at the stage's REDUCE_GRAD): the shard's gradient
//      is the replicas' mean (SetShardGradient);
//   2. the optimizer steps the shards;
//   3. GatherParameters all-gathers every replica's shard and copies the result into the
//      parameters, so every replica holds the same bits.
// The padding elements have zero gradients and stay zero under SGD and AdamW. Parameters
// without a gradient in a step count as zero gradient (a plain optimizer would skip them).
//
// Level gradients (ZeRO-2): FlatGradients frees each parameter's gradient as it copies it (and
// SetShardGradient any left), so between steps a replica holds only the shard's, and while the
// gradients are flattened they are held about once. Level parameters (ZeRO-3): besides, the stage's
// parameters hold no memory between uses (ReleaseStage: each becomes an empty tensor of its
// dtype, device and autograd identity); GatherStage all-gathers the shards into one new flat
// buffer and makes each parameter a view of its part, so the gathered copy is freed when the
// last view goes (ReleaseStage, and the autograd graphs that saved one). Step 3 is then left
// out: the next GatherStage spreads the stepped shards. The parameters' shapes are kept here.
//
// Checkpoints: every replica writes its shard of each stage as a training-state file
// "stage-<s>.optimizer-<k>-of-<D>.pt" holding the shard's values and optimizer state under the
// name "shard" and the stage's parameter names and shapes in order under "shard_layout"
// (checkpoint.h's layout), beside replica 0's stage-<s>.pt (parameters, no optimizer
// state). RestoreOptimizerState reassembles the stage's flat state from whatever the checkpoint
// holds — D' shard files, or a plain stage-<s>.pt's per-parameter state — and installs it for
// this task: into its shard for any replica count, or per parameter without sharding.
//
// Not thread-safe: the task's thread, except FlatGradients, SetShardGradient and GatherStage,
// which the communication thread calls for a stage the task's thread does not touch meanwhile.
// Stages are independent: calls for different stages may run on different threads at once.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "stagecoach/v1/types.pb.h"
#include "worker/collectives/collectives.h"
#include "worker/model/stage_model.h"
#include "worker/runtime/checkpoint/checkpoint.h"

namespace stagecoach::runtime {

using checkpoint::OptimizerShardFileName;

// A stage's parameters and their shapes: what a run of the stage outside its steps needs when
// the parameters are empty between uses (level parameters). The tensors share the stage's.
struct ParameterShapes {
  std::vector<torch::Tensor> params;
  std::vector<std::vector<int64_t>> shapes;
};

// Gives every empty parameter of `shapes` zeros of its shape (a check of input shapes needs the
// shapes, not the values); the returned closure empties them again. Not thread-safe: the
// stage must not run a step meanwhile.
std::function<void()> FillEmptyWithZeros(const ParameterShapes& shapes);

class ZeroShards {
 public:
  // Shards of every stage in `stages` (the rank's, which must outlive this) for `replica` of
  // `replicas`, initialised from the parameters. INVALID_ARGUMENT when a stage's parameters are
  // not all of one floating dtype.
  static absl::StatusOr<std::unique_ptr<ZeroShards>> Create(
      const std::map<int, model::StageModel*>& stages, int replica, int replicas,
      spec::ShardLevel level = spec::ShardLevel::kOptimizer);

  // The tensors the optimizer steps, one per stage in stage order.
  std::vector<torch::Tensor> ShardParameters() const;
  const torch::Tensor& shard(int stage) const { return layouts_.at(stage).shard; }
  // Elements of one shard (c), and of the stage's parameters (N).
  int64_t shard_numel(int stage) const { return layouts_.at(stage).shard.numel(); }
  int64_t stage_numel(int stage) const { return layouts_.at(stage).numel; }
  int replica() const { return replica_; }
  int replicas() const { return replicas_; }
  spec::ShardLevel level() const { return level_; }
  // The stages that have parameters, in order.
  std::vector<int> stages() const;

  // Copies the parameters into the shards (after a restore changed them).
  void LoadShards();
  // Sets the stages' parameter gradients to none (the optimizer's params are the shards).
  void ClearStageGradients();
  // Stage `stage`'s gradients, flattened and padded to D * c elements, on `device`.
  // From level gradients on, each parameter's gradient is freed as soon as it is copied, so
  // the stage holds its gradients about once, not twice, while they are flattened.
  torch::Tensor FlatGradients(int stage, torch::Device device);
  // The reduce-scattered gradient of the shard (c elements); from level gradients on, the
  // stage's parameters' gradients are freed.
  void SetShardGradient(int stage, const torch::Tensor& grad);
  // All-gathers every stage's shards into its parameters. The group's errors, naming the stage.
  absl::Status GatherParameters(collectives::Collectives& group, absl::Duration timeout);

  // Level parameters. All-gathers stage `stage`'s shards into a new flat buffer (D * c
  // elements, on the shards' device) and makes the parameters views of it; the group's errors,
  // naming the stage. Payload bytes of that buffer: gathered_bytes.
  absl::Status GatherStage(int stage, collectives::Collectives& group, absl::Duration timeout);
  int64_t gathered_bytes(int stage) const;
  // Stage `stage`'s parameters and their shapes.
  ParameterShapes ShapesOf(int stage) const;
  // Makes the stage's parameters empty (the gathered copy goes once nothing else holds it).
  void ReleaseStage(int stage);

  // This replica's shard file of every stage after `global_step` steps, copied for writing
  // (checkpoint.h's WriteSnapshot): the shard's values, its state in `optimizer`, the layout.
  absl::StatusOr<std::vector<StateSnapshot>> SnapshotShardFiles(
      int64_t global_step, const torch::optim::Optimizer& optimizer) const;

 private:
  struct Layout {
    std::vector<torch::Tensor> params;
    std::vector<std::string> names;            // the parameters' names, in order
    std::vector<std::vector<int64_t>> shapes;  // their shapes (level parameters empties them)
    int64_t numel = 0;
    torch::Tensor shard;  // leaf, c elements, the parameters' dtype and device
  };
  ZeroShards(int replica, int replicas, spec::ShardLevel level)
      : replica_(replica), replicas_(replicas), level_(level) {}
  static ShardLayout LayoutOf(const Layout& layout);
  // All-gathers the stage's shards: D * c elements on the group's memory (device memory for a
  // device-memory group, else the CPU).
  absl::StatusOr<torch::Tensor> AllGatherShards(int stage, collectives::Collectives& group,
                                                absl::Duration timeout);

  const int replica_;
  const int replicas_;
  const spec::ShardLevel level_;
  std::map<int, Layout> layouts_;
};

// Installs stage `stage`'s optimizer state from the checkpoint `resume` (its files of the
// stage) into `optimizer`: into `shards`' shard of the stage when sharded (shards non-null),
// else per parameter of `params`. The flat state comes from the stage's shard files when the
// checkpoint has them (any replica count), else from stage-<s>.pt's per-parameter state (a
// checkpoint written without sharding). The checkpoint's files are verified as
// RestoreStageCheckpoint does; errors name the file and what does not fit.
absl::Status RestoreOptimizerState(const v1::ResumeTask& resume, int stage,
                                   const std::vector<std::pair<std::string, torch::Tensor>>& params,
                                   const spec::OptimizerSpec& spec,
                                   torch::optim::Optimizer& optimizer, const ZeroShards* shards);

// Installs the optimizer state of stage `stage`'s `params` held in `saved` (per parameter,
// "<name>.<field>", as CheckpointByName::StateFor gives it for a checkpoint of another layout)
// into `shards`' shard of the stage: each field flattened over the parameters in order, zeros
// for a parameter without state, this replica's part of it. INVALID_ARGUMENT naming `where` when
// the state does not fit the shards; SetParamStateFields' errors.
absl::Status InstallShardState(const SavedState& saved, int stage,
                               const std::vector<std::pair<std::string, torch::Tensor>>& params,
                               torch::optim::Optimizer& optimizer, const ZeroShards& shards,
                               const std::string& where);

}  // namespace stagecoach::runtime
