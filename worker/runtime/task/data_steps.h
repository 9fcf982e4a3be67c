// Data steps: the steps that count in the job's timeline. A data step runs the spec's batch for
// the timeline's step (an Infer job's task: the client's batch, its outputs kept for
// ReportTaskEnd on the rank owning the last stage); RunCounted is the counted step itself, which
// a training client step shares: clear the gradients (set them to none), run the rank's action
// list, step the optimizer (not on forward-only tasks; the recipe sets its learning rate, clips, or
// skips the step), run the validation pass that falls due, end the step at the gate, write the
// checkpoint that falls due, report. DataSteps owns the task's executor and its data stream, and
// knows whether the executor's agreed shapes are the data's (a client step of another shape changes
// them until the next data step agrees them again).
//
// Not thread-safe: the task's thread only. Everything in StepEnv must outlive it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stagecoach/v1/types.pb.h"
#include "worker/runtime/data/training_data.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/runtime/sharding/parameter_gathering.h"
#include "worker/runtime/snapshot/snapshot_steps.h"
#include "worker/runtime/task/checkpoint_steps.h"
#include "worker/runtime/task/evaluation.h"
#include "worker/runtime/task/step_gate.h"
#include "worker/runtime/task/step_reports.h"
#include "worker/runtime/task/task_setup.h"
#include "worker/runtime/training/gradient_reduction.h"
#include "worker/runtime/training/replica_membership.h"
#include "worker/runtime/training/step_recipe.h"
#include "worker/runtime/training/step_rollback.h"
#include "worker/runtime/training/tied_parameters.h"

namespace stagecoach::runtime {

// What the step parts of a task share (none owned).
struct StepEnv {
  const v1::TaskAssignment* task = nullptr;
  TaskSetup* setup = nullptr;
  transport::Transport* transport = nullptr;
  StepGate* gate = nullptr;
  StepReports* reports = nullptr;
  CheckpointSteps* checkpoints = nullptr;
  // Training tasks of jobs with training.snapshot: takes the in-memory snapshots; else null.
  SnapshotSteps* snapshots = nullptr;
  // The task's count of counted steps (TaskRunner::steps_done).
  std::atomic<int64_t>* steps_done = nullptr;
  // An Infer job on the rank owning the last stage: where its merged outputs go.
  std::optional<v1::TensorData>* inference_outputs = nullptr;
  // With data-parallel replicas (training tasks): reduces the stages' gradients; else null.
  GradientReducer* reducer = nullptr;
  // Training tasks: the recipe's learning rate, clipping and skipping around each optimizer
  // step; null for forward-only tasks.
  StepRecipe* recipe = nullptr;
  // Training tasks whose rank holds a tied copy on another stage (tied embeddings); else null.
  TiedGradients* tied = nullptr;
  // CPU tasks of a worker daemon: measures each step's activation peak (ExecutorOptions::
  // memory_counter); else null.
  CountingCpuAllocator* memory_counter = nullptr;
  // Replicas that carry on (TaskAssignment.settle_steps): every step is settled with the
  // coordinator before its optimizer step, and what it changed is undone when it is abandoned
  // or run again over several slices; else both null.
  ReplicaMembership* membership = nullptr;
  StepRollback* rollback = nullptr;
  // Marked with the step's phases here and its actions and waits by the executor; may be null.
  ProgressBeacon* progress = nullptr;
  // ExecutorOptions::debug_slow_factor (the worker's --debug-slow-actions).
  double debug_slow_factor = 1.0;
  // With placement.shard: parameters and replicas: what UNSHARD and RESHARD do; the
  // checkpoints and evaluations gather every stage around them. Else null.
  ParameterGathering* gathering = nullptr;
};

// The shapes and dtypes of stage 0's microbatches, for PipelineExecutor::AgreeShapes (empty on
// the ranks that do not own stage 0, which pass no microbatches).
std::vector<TensorMeta> MetasOf(const std::vector<torch::Tensor>& microbatches);

class DataSteps {
 public:
  // Opens the data stream (a tokens file is read here, by the ranks that need it) and, for a
  // training task whose spec has `eval`, the evaluator's, and agrees the shapes of the task's
  // first batch with the other ranks. The data sources', the executor's and AgreeShapes's
  // errors.
  static absl::StatusOr<std::unique_ptr<DataSteps>> Create(const StepEnv& env);

  // The data step at `global_step` (the steps the gate had done when it decided on it). With
  // replicas that carry on, the slices of the global batch the membership gives this replica,
  // run again from the step's start whenever the step is abandoned (replica_membership.h).
  absl::Status RunDataStep(int64_t global_step);

  // A counted step at `global_step` on `inputs` (stage 0's microbatches, on its rank) and
  // `targets` (the last stage's, on its rank); `client_batch` marks its report. With the loss
  // normalised by tokens, `counted_tokens` is the whole global batch's count of counted targets
  // (on the last stage's rank).
  // FAILED_PRECONDITION while the replicas carry on without a lost one (a client's batch is cut
  // for every replica). A step abandoned by the settling is ABORTED.
  absl::Status RunCounted(const std::vector<torch::Tensor>& inputs,
                          const std::vector<torch::Tensor>& targets, bool client_batch,
                          int64_t global_step, int64_t counted_tokens = 0);

  // Agrees the shapes of another batch's microbatches (a client step's) on the task's
  // executor; the next data step agrees the data's again.
  absl::Status AgreeOtherShapes(const std::vector<TensorMeta>& inputs);

  PipelineExecutor& executor() { return *executor_; }
  const ExecutorOptions& executor_options() const { return options_; }

  // A fault for tests (STAGECOACH_FAULT_STEP_STALL, read at construction): the step at
  // `global_step` sleeps `duration` before its passes, logging "stalling before global step S".
  struct Stall {
    int64_t global_step = 0;
    absl::Duration duration;
  };

 private:
  explicit DataSteps(const StepEnv& env);
  // Marks the step's phase in env_.progress, if any.
  void Mark(v1::RankPhase phase) {
    if (env_.progress != nullptr) env_.progress->SetPhase(phase);
  }

  // One slice of the global batch: stage 0's and the last stage's microbatches, on their ranks,
  // and the shapes planned for stage 0's (rows of documents run padded to their microbatch's
  // longest row, planned for the spec's window).
  struct Pass {
    std::vector<torch::Tensor> inputs;
    std::vector<torch::Tensor> targets;
    std::vector<TensorMeta> planned;
    // Packed rows: every microbatch's segments, on every rank; else empty.
    std::vector<torch::Tensor> segments;
  };
  // The passes of this replica's slices of `batch`.
  std::vector<Pass> PassesOf(const Batch& batch) const;
  // The counted step over `passes` (gradients accumulated over them; see RunCounted). false when
  // the settling abandoned it (undone; the membership changed: run it again).
  absl::StatusOr<bool> RunPasses(const std::vector<Pass>& passes, bool client_batch,
                                 int64_t global_step, int64_t counted_tokens);
  // The executor's token normalisation of a step whose global batch counts `counted_tokens`:
  // only on the last stage's rank of a job whose loss is normalised by tokens.
  std::optional<TokenNormalization> TokensOf(int64_t counted_tokens) const;
  // After the passes: reduces the gradients over the replicas (and gives every replica the
  // first one's buffers), sums the tied copies, and settles the step when the replicas carry
  // on. false when it was abandoned.
  absl::StatusOr<bool> ReduceAndSettle(const StepResult& result, int64_t step, int64_t global_step,
                                       std::optional<ReductionReport>* reduction);

  const StepEnv env_;
  ExecutorOptions options_;
  std::unique_ptr<PipelineExecutor> executor_;
  std::unique_ptr<BatchSource> data_;
  // Validation passes (training tasks with `eval`); else null.
  std::unique_ptr<Evaluator> evaluator_;
  bool owns_first_ = false;
  bool owns_last_ = false;
  bool want_targets_ = false;
  // training.loss_normalization resolves to tokens (training tasks).
  bool tokens_normalized_ = false;
  // Whether the executor's agreed shapes are the data's.
  bool data_shapes_ = true;
  const std::optional<Stall> stall_;
};

}  // namespace stagecoach::runtime
