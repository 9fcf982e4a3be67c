// Validation passes (the spec's `eval`): after every eval.every_steps-th global step, the job's
// pipeline runs forward only over eval.batches held-out batches, and the rank owning the last
// stage takes each microbatch's loss.
//
// A pass runs the F, SEND_F and RECV_F actions of the rank's training action list
// (forward_actions.h) on an executor of its own (forward-only: no graph is kept), with the
// stages in evaluation mode (StageModel::SetTraining(false)) and no gradients. Batch j of a pass
// is the eval data stream's step j (the same batches every pass), of training.batch_size rows,
// split like a training batch: into the replicas' shares and each share into the job's
// microbatches. The job's eval loss is the mean over the passes's batches of each batch's loss
// (the mean of its microbatches' losses); the coordinator joins the replicas' microbatch losses
// into it.
//
// Not thread-safe: the task's thread, between steps. The StepEnv's parts must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/action.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/runtime/task/task_setup.h"
#include "worker/runtime/data/training_data.h"

namespace stagecoach::runtime {

class Evaluator {
 public:
  // For a training task whose spec has `eval`: opens the eval data (the ranks owning the first
  // and last stages) with `training_options` made forward-only. The data source's errors, with
  // the eval.data field named.
  static absl::StatusOr<std::unique_ptr<Evaluator>> Create(const v1::TaskAssignment& task,
                                                           const TaskSetup& setup,
                                                           transport::Transport* transport,
                                                           ExecutorOptions training_options);

  // Whether a pass follows the step at `global_step` (0-based): (global_step + 1) is a multiple
  // of eval.every_steps.
  bool DueAfter(int64_t global_step) const;

  // Runs one pass. On the rank owning the last stage: eval.batches x microbatches losses, batch
  // by batch; on the others: empty. With several slices (SetSlices), each batch's slices one
  // after another: eval.batches x slices x microbatches losses. The executor's errors; a
  // non-finite loss is reported as it is.
  absl::StatusOr<std::vector<double>> Run();

  // The replica slices of each batch the pass runs (replica_membership.h); the replica's own
  // until set.
  void SetSlices(std::vector<int> slices) { slices_ = std::move(slices); }

 private:
  Evaluator(const TaskSetup& setup, ExecutorOptions options, transport::Transport* transport,
            int replica, int replicas);

  const TaskSetup& setup_;
  const ExecutorOptions options_;
  const int replicas_;
  std::vector<int> slices_;
  std::unique_ptr<PipelineExecutor> executor_;
  std::vector<schedule::Action> actions_;
  std::unique_ptr<BatchSource> data_;
  bool owns_first_ = false;
  bool owns_last_ = false;
  bool shapes_agreed_ = false;
};

}  // namespace stagecoach::runtime
