#include "tests/support/reference_torchscript.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <memory>

#include "absl/strings/str_format.h"

namespace stagecoach::testing {
namespace {

torch::Tensor AsModelInput(const torch::Tensor& x) {
  return x.is_floating_point() ? x.to(torch::kFloat32) : x.to(torch::kInt64);
}

torch::Tensor AsTarget(const torch::Tensor& y, const std::string& loss) {
  return loss == "cross_entropy" ? y.to(torch::kInt64) : y.to(torch::kFloat32);
}

// mse: mean over elements; cross_entropy: mean over rows, where a row is the last dimension of
// the output ([rows, classes], or [B, T, classes] with targets [B, T]).
torch::Tensor Loss(const torch::Tensor& out, const torch::Tensor& target, const std::string& loss) {
  if (loss == "cross_entropy") {
    return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}),
                                                target.reshape({-1}));
  }
  return torch::nn::functional::mse_loss(out, target);
}

std::map<std::string, torch::Tensor> Snapshot(const torch::jit::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    out[p.name] = p.value.detach().clone();
  }
  return out;
}

}  // namespace

torch::Tensor TensorsBatch(const torch::Tensor& data, int64_t step, int64_t batch_size) {
  const int64_t n = data.size(0);
  std::vector<int64_t> rows;
  rows.reserve(batch_size);
  for (int64_t i = 0; i < batch_size; ++i) rows.push_back((step * batch_size + i) % n);
  return data.index_select(0, torch::tensor(rows, torch::kInt64));
}

TorchScriptReferenceResult TrainTorchScriptReference(const TorchScriptReferenceConfig& c) {
  torch::jit::Module module = torch::jit::load(c.model_path, torch::kCPU);
  module.train();
  std::vector<torch::Tensor> params;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    p.set_requires_grad(true);
    params.push_back(p);
  }
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (c.optimizer == "sgd") {
    opt = std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr)
                    .momentum(c.momentum)
                    .weight_decay(c.weight_decay < 0 ? 0.0 : c.weight_decay));
  } else {
    opt = std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(c.lr)
                    .betas({c.beta1, c.beta2})
                    .eps(c.eps)
                    .weight_decay(c.weight_decay < 0 ? 0.01 : c.weight_decay));
  }

  TorchScriptReferenceResult result;
  result.initial_params = Snapshot(module);
  for (int64_t step = 0; step < c.steps; ++step) {
    const torch::Tensor x = AsModelInput(TensorsBatch(c.inputs, step, c.batch_size));
    const torch::Tensor y = AsTarget(TensorsBatch(c.targets, step, c.batch_size), c.loss);
    const std::vector<torch::Tensor> xs = torch::tensor_split(x, c.microbatches, 0);
    const std::vector<torch::Tensor> ys = torch::tensor_split(y, c.microbatches, 0);
    opt->zero_grad();
    std::vector<torch::Tensor> losses;
    for (int mb = 0; mb < c.microbatches; ++mb) {
      const torch::Tensor out = module.forward({xs[mb]}).toTensor();
      losses.push_back(Loss(out, ys[mb], c.loss));
    }
    torch::stack(losses).mean().backward();
    opt->step();
    double sum = 0;
    for (const auto& l : losses) sum += l.item<double>();
    result.losses.push_back(sum / c.microbatches);
  }
  result.params = Snapshot(module);
  return result;
}

torch::Tensor TorchScriptReferenceForward(const std::string& model_path,
                                          const torch::Tensor& inputs) {
  torch::NoGradGuard no_grad;
  torch::jit::Module module = torch::jit::load(model_path, torch::kCPU);
  module.eval();
  return module.forward({AsModelInput(inputs)}).toTensor();
}

std::string TorchScriptOptimizerYaml(const TorchScriptReferenceConfig& c) {
  if (c.optimizer == "sgd") {
    return absl::StrFormat("{kind: sgd, lr: %.17g, momentum: %.17g, weight_decay: %.17g}", c.lr,
                           c.momentum, c.weight_decay < 0 ? 0.0 : c.weight_decay);
  }
  return absl::StrFormat(
      "{kind: adamw, lr: %.17g, weight_decay: %.17g, betas: [%.17g, %.17g], eps: %.17g}", c.lr,
      c.weight_decay < 0 ? 0.01 : c.weight_decay, c.beta1, c.beta2, c.eps);
}

}  // namespace stagecoach::testing
