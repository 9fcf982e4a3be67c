#include "worker/runtime/training/step_recipe.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/spec/learning_rate.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {
namespace {

// The gradients the optimizer will step with, in its order, and those of them the norm counts
// (all but `not_counted`'s).
void GradientsOf(torch::optim::Optimizer& optimizer, const torch::Tensor& not_counted,
                 std::vector<torch::Tensor>& all, std::vector<torch::Tensor>& counted) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      all.push_back(p.grad());
      if (!not_counted.defined() || !p.is_same(not_counted)) counted.push_back(p.grad());
    }
  }
}

// Whether every gradient holds only finite values (the slow check, for a norm that overflowed).
bool AllFinite(const std::vector<torch::Tensor>& grads) {
  for (const torch::Tensor& g : grads) {
    if (!torch::isfinite(g).all().item<bool>()) return false;
  }
  return true;
}

}  // namespace

absl::Status StepRecipe::SumOverShards(std::vector<double>& stats) const {
  collectives::Collectives& group = *options_.shard_group;
  const int64_t n = static_cast<int64_t>(stats.size());
  if (!group.takes_device_memory()) {
    return group.AllReduce(stats.data(), n, collectives::DataType::kFloat64,
                           collectives::ReduceOp::kSum, options_.timeout);
  }
  torch::Tensor on_device = torch::tensor(stats, torch::kFloat64).to(options_.device);
  RETURN_IF_ERROR(group.AllReduce(on_device.data_ptr(), n, collectives::DataType::kFloat64,
                                  collectives::ReduceOp::kSum, options_.timeout));
  const torch::Tensor host = on_device.to(torch::kCPU);
  std::copy(host.data_ptr<double>(), host.data_ptr<double>() + n, stats.begin());
  return absl::OkStatus();
}

double StepRecipe::LearningRateAt(int64_t global_step) const {
  return spec::LearningRateAt(options_.training.lr_schedule, options_.training.optimizer.lr,
                              global_step, options_.timeline_steps);
}

absl::StatusOr<RecipeDecision> StepRecipe::Prepare(int64_t global_step,
                                                   torch::optim::Optimizer& optimizer) {
  RecipeDecision decision;
  decision.learning_rate = LearningRateAt(global_step);
  for (auto& group : optimizer.param_groups()) group.options().set_lr(decision.learning_rate);

  std::vector<torch::Tensor> grads, counted;
  GradientsOf(optimizer, options_.not_counted, grads, counted);
  double sum_of_squares = 0.0;
  if (!counted.empty()) {
    // Each gradient's norm in its own dtype, as clip_grad_norm_ takes it; squared and summed in
    // double, read back once (one device synchronisation).
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> norms;
    norms.reserve(counted.size());
    for (const torch::Tensor& g : counted) norms.push_back(g.norm(2).to(torch::kFloat64));
    sum_of_squares = torch::stack(norms).square().sum().item<double>();
  }
  // [sum of squares, one non-finite flag per pipeline rank].
  std::vector<double> stats(1 + options_.ranks, 0.0);
  const bool finite = std::isfinite(sum_of_squares) || AllFinite(grads);
  stats[0] = std::isfinite(sum_of_squares) ? sum_of_squares : (finite ? HUGE_VAL : 0.0);
  stats[1 + options_.rank] = finite ? 0.0 : 1.0;
  if (options_.shard_group != nullptr) RETURN_IF_ERROR(SumOverShards(stats));
  ASSIGN_OR_RETURN(stats, pipeline_->SumOverRanks(stats));
  for (int r = 0; r < options_.ranks; ++r) {
    if (stats[1 + r] != 0.0) decision.nonfinite_ranks.push_back(r);
  }
  decision.skip = !decision.nonfinite_ranks.empty();
  if (decision.skip || !options_.training.grad_clip_max_norm.has_value()) return decision;

  const double norm = std::sqrt(stats[0]);
  decision.grad_norm = norm;
  // clip_grad_norm_'s coefficient, in float32 as it computes it for float32 gradients.
  const float coefficient = static_cast<float>(*options_.training.grad_clip_max_norm) /
                            (static_cast<float>(norm) + 1e-6f);
  if (coefficient < 1.0f) {
    decision.clip_coefficient = coefficient;
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& g : grads) g.mul_(coefficient);
  }
  return decision;
}

}  // namespace stagecoach::runtime
