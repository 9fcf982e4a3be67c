// The loss and optimizer a job's spec asks for.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"

namespace stagecoach::runtime {

enum class LossKind { kMse, kCrossEntropy };

// training.loss -> LossKind; INVALID_ARGUMENT for another name.
absl::StatusOr<LossKind> ParseLoss(const std::string& name);

// One microbatch's loss: mse is the mean over elements, cross_entropy the mean over rows of
// integer class targets; for sequence logits [B, T, V] with targets [B, T], cross_entropy is the
// mean over all B * T positions.
torch::Tensor ComputeLoss(LossKind kind, const torch::Tensor& output, const torch::Tensor& target);

// training.optimizer over `parameters`: sgd (lr, momentum, weight_decay) or adamw (lr, betas,
// eps, weight_decay), with PyTorch's semantics.
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    const spec::OptimizerSpec& spec, std::vector<torch::Tensor> parameters);

}  // namespace stagecoach::runtime
