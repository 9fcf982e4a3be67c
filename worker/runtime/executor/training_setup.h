// The loss and optimizer a job's spec asks for.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"

namespace stagecoach::runtime {

enum class LossKind { kMse, kCrossEntropy };

// training.loss -> LossKind; INVALID_ARGUMENT for another name.
absl::StatusOr<LossKind> ParseLoss(const std::string& name);

// A target that does not count (padding, a prompt's tokens): PyTorch's ignore_index default.
constexpr int64_t kIgnoredTarget = -100;

// One microbatch's loss: mse is the mean over elements, cross_entropy the mean over rows of
// integer class targets; for sequence logits [B, T, V] with targets [B, T], cross_entropy is the
// mean over all B * T positions. Targets equal to kIgnoredTarget are left out of the mean.
torch::Tensor ComputeLoss(LossKind kind, const torch::Tensor& output, const torch::Tensor& target);

// training.loss_normalization (see PipelineExecutor::TokenNormalization).
enum class LossNormalization { kMicrobatches, kTokens };
absl::StatusOr<LossNormalization> ParseLossNormalization(const std::string& name);

// cross_entropy's sum over the counted positions (targets other than kIgnoredTarget) of
// `output` (logits [..., V]) against `target` ([...]): the numerator of a token-normalised loss.
torch::Tensor SummedTokenLoss(const torch::Tensor& output, const torch::Tensor& target);

// How many of `target`'s positions count (are not kIgnoredTarget).
int64_t CountedTokens(const torch::Tensor& target);

// training.optimizer over `parameters`: sgd (lr, momentum, weight_decay) or adamw (lr, betas,
// eps, weight_decay), with PyTorch's semantics.
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    const spec::OptimizerSpec& spec, std::vector<torch::Tensor> parameters);

}  // namespace stagecoach::runtime
