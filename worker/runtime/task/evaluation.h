// Validation passes (the spec's `eval`): after every eval.every_steps-th global step, the job's
// pipeline runs forward only over eval.batches held-out batches, and the rank owning the last
// stage takes each microbatch's loss.
//
// A pass runs the F, SEND_F and RECV_F actions of the rank's training action list
// (forward_actions.h) on an executor of its own (forward-only: no graph is kept), with the
// stages in evaluation mode (StageModel::SetTraining(false)) and no gradients. Batch j of a pass
// is the eval data stream's step j (the same batches every pass), of training.batch_size rows,
// split like a training batch: into the replicas' shares and each share into the job's
// microbatches. The job's eval loss follows training.loss_normalization: with `microbatches`, the
// mean over the pass's batches of each batch's loss (the mean of its microbatches' losses); with
// `tokens` (the default for token data), the sum of every counted token's loss over all the
// pass's batches divided by their count, so that it does not depend on how the rows were cut
// into microbatches and replicas. The coordinator joins the replicas' microbatch losses (and
// counts) into it.
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

  // What a pass measured on the rank owning the last stage: eval.batches x microbatches losses,
  // batch by batch (with several slices, SetSlices, each batch's slices one after another:
  // eval.batches x slices x microbatches); with the loss normalised by tokens, each one's count
  // of counted targets in `tokens` (loss 0 where it counted none). Empty on the other ranks.
  struct Losses {
    std::vector<double> losses;
    std::vector<int64_t> tokens;
  };

  // Runs one pass. The executor's errors; a non-finite loss is reported as it is.
  absl::StatusOr<Losses> Run();

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
  bool by_tokens_ = false;  // training.loss_normalization: tokens
};

}  // namespace stagecoach::runtime
