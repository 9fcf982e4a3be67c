#include "worker/runtime/executor/training_setup.h"

#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "absl/strings/str_cat.h"

namespace stagecoach::runtime {

absl::StatusOr<LossKind> ParseLoss(const std::string& name) {
  if (name == "mse") return LossKind::kMse;
  if (name == "cross_entropy") return LossKind::kCrossEntropy;
  return absl::InvalidArgumentError(
      absl::StrCat("training.loss: must be mse or cross_entropy, got '", name, "'"));
}

torch::Tensor ComputeLoss(LossKind kind, const torch::Tensor& output, const torch::Tensor& target) {
  namespace F = torch::nn::functional;
  if (kind == LossKind::kMse) return F::mse_loss(output, target);
  if (output.dim() > 2) {
    // Sequence logits [B, T, V] with targets [B, T]: the mean over all B * T positions.
    return F::cross_entropy(output.reshape({-1, output.size(-1)}), target.reshape({-1}));
  }
  return F::cross_entropy(output, target);
}

absl::StatusOr<LossNormalization> ParseLossNormalization(const std::string& name) {
  if (name == "microbatches") return LossNormalization::kMicrobatches;
  if (name == "tokens") return LossNormalization::kTokens;
  return absl::InvalidArgumentError(absl::StrCat(
      "training.loss_normalization: must be tokens or microbatches, got '", name, "'"));
}

torch::Tensor SummedTokenLoss(const torch::Tensor& output, const torch::Tensor& target) {
  namespace F = torch::nn::functional;
  return F::cross_entropy(
      output.reshape({-1, output.size(-1)}), target.reshape({-1}),
      F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(kIgnoredTarget));
}

int64_t CountedTokens(const torch::Tensor& target) {
  return target.ne(kIgnoredTarget).sum().item<int64_t>();
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    const spec::OptimizerSpec& spec, std::vector<torch::Tensor> parameters) {
  if (spec.kind == "sgd") {
    torch::optim::SGDOptions options(spec.lr);
    options.momentum(spec.momentum).weight_decay(spec.weight_decay);
    return std::unique_ptr<torch::optim::Optimizer>(
        new torch::optim::SGD(std::move(parameters), options));
  }
  if (spec.kind == "adamw") {
    torch::optim::AdamWOptions options(spec.lr);
    options.betas({spec.beta1, spec.beta2}).eps(spec.eps).weight_decay(spec.weight_decay);
    return std::unique_ptr<torch::optim::Optimizer>(
        new torch::optim::AdamW(std::move(parameters), options));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("training.optimizer.kind: must be sgd or adamw, got '", spec.kind, "'"));
}

}  // namespace stagecoach::runtime
