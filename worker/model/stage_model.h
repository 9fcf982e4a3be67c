// One pipeline stage's part of a model: the layers it owns and how to run them forward.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace stagecoach::model {

// LibTorch's default generator is process-wide: building built-in models from seeds (seeding it,
// then drawing every layer's initial values) holds this lock so that builds do not interleave.
std::mutex& SeedMutex();

// A stage's layers. Not thread-safe; a stage is run by one thread at a time.
class StageModel {
 public:
  virtual ~StageModel() = default;

  // Runs the stage on one microbatch. Autograd records the graph when grad mode is on.
  virtual torch::Tensor Forward(const torch::Tensor& input) = 0;

  // The stage's parameters with their names in the whole model (e.g. "3.weight"), in a
  // stable order.
  virtual std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() = 0;

  // Moves the stage's parameters to `device`; call before handing them to an optimizer.
  virtual void To(const torch::Device& device) = 0;

  std::vector<torch::Tensor> Parameters() {
    std::vector<torch::Tensor> out;
    for (auto& [name, p] : NamedParameters()) out.push_back(p);
    return out;
  }
};

}  // namespace stagecoach::model
