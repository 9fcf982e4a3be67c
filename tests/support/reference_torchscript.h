// The numerical contract's reference for user TorchScript models: the whole model trained in one
// process without a pipeline, in plain LibTorch, sharing no code with the worker's model
// loading, graph split, data or executor. It follows DESIGN.md ("Spec", "Numerical contract"):
// data.kind tensors step k uses the batch_size rows from (k * batch_size) mod N, wrapping around;
// each step's batch is split along dim 0 like torch.tensor_split (sizes differ by at most one,
// larger first); the step loss is the mean over microbatches of each microbatch's loss (mse:
// mean over elements; cross_entropy: mean over rows); gradients are those of that mean; then one
// optimizer step (torch::optim::SGD or AdamW with the spec's hyper-parameters).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace stagecoach::testing {

struct TorchScriptReferenceConfig {
  // A torch.jit.save file; loaded afresh (on the CPU) by every call.
  std::string model_path;
  // The dataset: inputs [N, ...] (floating point converted to float32, integers to int64) and
  // targets [N] class indices (cross_entropy) or [N, ...] values (mse).
  torch::Tensor inputs;
  torch::Tensor targets;
  int64_t batch_size = 0;
  int microbatches = 1;
  int64_t steps = 1;
  std::string loss = "mse";       // mse | cross_entropy
  std::string optimizer = "sgd";  // sgd | adamw
  double lr = 0.01;
  double momentum = 0.0;       // sgd only
  double weight_decay = -1.0;  // < 0: the spec's default (sgd 0, adamw 0.01)
  double beta1 = 0.9;          // adamw only
  double beta2 = 0.999;        // adamw only
  double eps = 1e-8;           // adamw only
};

struct TorchScriptReferenceResult {
  // Mean over microbatches of each microbatch's loss, one per step.
  std::vector<double> losses;
  // The model's named parameters ("blocks.0.weight", as named_parameters() names them).
  std::map<std::string, torch::Tensor> initial_params;  // before the first step
  std::map<std::string, torch::Tensor> params;          // after the last step
};

// Trains `config.model_path` for `config.steps` steps. Errors (a file that does not load, a
// forward that fails) are thrown as c10::Error, which gtest reports as a failure.
TorchScriptReferenceResult TrainTorchScriptReference(const TorchScriptReferenceConfig& config);

// The model's output for `inputs` in eval mode without gradients, in one process.
torch::Tensor TorchScriptReferenceForward(const std::string& model_path,
                                          const torch::Tensor& inputs);

// The job spec's `training.optimizer` flow map matching `config`, so spec and reference agree.
std::string TorchScriptOptimizerYaml(const TorchScriptReferenceConfig& config);

// The step-k batch rows of a tensors dataset: rows (k * batch_size + i) mod N, i < batch_size.
torch::Tensor TensorsBatch(const torch::Tensor& data, int64_t step, int64_t batch_size);

}  // namespace stagecoach::testing
