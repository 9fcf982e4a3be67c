// Step reports: the ReportStepRequest of each step a task runs (losses, executed actions and
// their timings, bytes moved, parameters held, step time), built from the executor's StepResult
// and the transport's counters, and sent to the task's TaskReporter. A failed send is logged,
// never fatal (the coordinator learns of a lost worker otherwise).
//
// Not thread-safe: the task's thread only. The transport and the reporter must outlive it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "stagecoach/v1/types.pb.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/runtime/sharding/parameter_gathering.h"
#include "worker/runtime/task/task_runner.h"
#include "worker/runtime/training/gradient_reduction.h"
#include "worker/runtime/training/step_recipe.h"
#include "worker/transport/transport.h"

namespace stagecoach::runtime {

// Where a step started: the wall-clock time and the transport's byte counters then.
struct StepMark {
  absl::Time start;
  transport::TransferStats stats;
};

class StepReports {
 public:
  // `held_parameters`: the parameter elements the rank holds (ReportStepRequest.parameters).
  StepReports(const v1::TaskAssignment& task, std::string worker_id, int64_t held_parameters,
              const transport::Transport* transport, TaskReporter* reporter);

  // Marks the start of a step (now, and the transport's counters).
  StepMark Mark() const;

  // The report of a step that started at `mark` and produced `result`: `step` is the task's
  // count of counted steps before it, `global_step` the timeline's step count it reports. The
  // step time runs until this call; the bytes moved until `pipeline_end` (the transport's
  // counters when the pipeline's transfers and the tied copies' exchange were done, so that the
  // job reduction's few bytes after them are not counted), else until this call. A validation
  // pass after the report is built is not counted in any step.
  v1::ReportStepRequest Step(const StepResult& result, const StepMark& mark, int64_t step,
                             int64_t global_step,
                             std::optional<transport::TransferStats> pipeline_end = {}) const;

  // Adds the training recipe's decisions of the step (step_recipe.h) to its report.
  static void AddRecipe(const RecipeDecision& decision, v1::ReportStepRequest* report);

  // Adds a step's gradient reduction (`reduction`, its bucket times relative to mark.start) to
  // its report, with bucket times moved to the report's step start.
  static void AddReduction(const ReductionReport& reduction, const StepMark& mark,
                           v1::ReportStepRequest* report);
  // Adds a step's all-gathers of sharded parameters (placement.shard: parameters) to its
  // report's reduction, times moved as AddReduction's.
  static void AddGathers(const GatherReport& gathers, const StepMark& mark,
                         v1::ReportStepRequest* report);

  // A checkpoint_only report (a checkpoint written while holding at `global_step`).
  v1::ReportStepRequest CheckpointOnly(int64_t step, int64_t global_step) const;

  // Sends `report`; logs a failure.
  void Send(const v1::ReportStepRequest& report) const;

 private:
  // The report's identity fields (worker, job, attempt, rank, steps, parameters).
  v1::ReportStepRequest Header(int64_t step, int64_t global_step) const;

  const v1::TaskAssignment& task_;
  const std::string worker_id_;
  const int64_t held_parameters_;
  const transport::Transport* transport_;
  TaskReporter* reporter_;
};

// The last stage's outputs of a forward-only step, merged along dim 0 (one row per input row).
// INTERNAL naming `rank` when the step produced fewer than `microbatches` outputs.
absl::StatusOr<v1::TensorData> MergedOutputs(const StepResult& result, int microbatches, int rank);

}  // namespace stagecoach::runtime
