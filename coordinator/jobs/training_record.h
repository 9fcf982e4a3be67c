// What the training recipe did in a job's completed steps, as the coordinator keeps and shows it
// (docs/training-recipe.md): the latest step's learning rate and gradient norm, the global steps
// whose optimizer step every rank skipped for non-finite gradients, and the validation losses.
// Bounded by the job's steps like its losses; a restart drops what the steps it re-runs had
// recorded.
//
// No lock of its own: a part of Job, under the job table's lock.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

struct TrainingRecord {
  // The latest completed training step's.
  double learning_rate = 0.0;
  std::optional<double> grad_norm;
  // Global steps skipped, ascending.
  std::vector<int64_t> skipped_steps;
  // Validation results, by ascending global step.
  std::vector<v1::EvalResult> evals;
  // The latest completed step recorded (global), -1 before the first.
  int64_t last_step = -1;

  // Completed training step `global_step` (after every earlier one).
  void AddStep(int64_t global_step, double lr, std::optional<double> norm, bool skipped);
  void AddEval(int64_t global_step, double loss);

  // The skipped steps in a row that end at last_step (0 when last_step was not skipped).
  int64_t ConsecutiveSkipped() const;

  // Forgets the steps from `global_step` on (a restart re-runs them).
  void DropFrom(int64_t global_step);

  // Into / from the job's record (v1::Job's learning_rate, grad_norm, skipped_steps,
  // consecutive_skipped_steps, evals); `global_steps_done` is the record's.
  // ToProto(out, from, to) shows only the skipped steps and evals of global steps [from, to).
  void ToProto(v1::Job* out, int64_t from = 0, int64_t to = INT64_MAX) const;
  void FromProto(const v1::Job& record);
};

}  // namespace stagecoach::coordinator
