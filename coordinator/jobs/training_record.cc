#include "coordinator/jobs/training_record.h"

#include <algorithm>

namespace stagecoach::coordinator {

void TrainingRecord::AddStep(int64_t global_step, double lr, std::optional<double> norm,
                             bool skipped) {
  learning_rate = lr;
  grad_norm = norm;
  if (skipped) skipped_steps.push_back(global_step);
  last_step = global_step;
}

void TrainingRecord::AddEval(int64_t global_step, double loss) {
  v1::EvalResult result;
  result.set_global_step(global_step);
  result.set_loss(loss);
  evals.push_back(result);
}

int64_t TrainingRecord::ConsecutiveSkipped() const {
  int64_t run = 0;
  for (auto it = skipped_steps.rbegin(); it != skipped_steps.rend(); ++it) {
    if (*it != last_step - run) break;
    ++run;
  }
  return run;
}

void TrainingRecord::DropFrom(int64_t global_step) {
  skipped_steps.erase(
      std::lower_bound(skipped_steps.begin(), skipped_steps.end(), global_step),
      skipped_steps.end());
  evals.erase(std::remove_if(evals.begin(), evals.end(),
                             [&](const v1::EvalResult& e) { return e.global_step() >= global_step; }),
              evals.end());
  last_step = std::min(last_step, global_step - 1);
}

void TrainingRecord::ToProto(v1::Job* out, int64_t from, int64_t to) const {
  out->set_learning_rate(learning_rate);
  if (grad_norm.has_value()) out->set_grad_norm(*grad_norm);
  for (int64_t step : skipped_steps) {
    if (step >= from && step < to) out->add_skipped_steps(step);
  }
  out->set_consecutive_skipped_steps(ConsecutiveSkipped());
  for (const v1::EvalResult& e : evals) {
    if (e.global_step() >= from && e.global_step() < to) *out->add_evals() = e;
  }
}

void TrainingRecord::FromProto(const v1::Job& record) {
  learning_rate = record.learning_rate();
  grad_norm.reset();
  if (record.has_grad_norm()) grad_norm = record.grad_norm();
  skipped_steps.assign(record.skipped_steps().begin(), record.skipped_steps().end());
  std::sort(skipped_steps.begin(), skipped_steps.end());
  evals.assign(record.evals().begin(), record.evals().end());
  last_step = record.global_steps_done() - 1;
}

}  // namespace stagecoach::coordinator
