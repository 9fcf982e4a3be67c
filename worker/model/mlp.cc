#include "worker/model/mlp.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <mutex>

#include "absl/strings/str_cat.h"

namespace stagecoach::model {

namespace {

class MlpStage : public StageModel {
 public:
  MlpStage(std::vector<std::pair<int, torch::nn::Linear>> layers, int last_layer)
      : layers_(std::move(layers)), last_layer_(last_layer) {}

  std::vector<torch::Tensor> ForwardValues(const std::vector<torch::Tensor>& inputs) override {
    torch::Tensor x = inputs.at(0);
    for (auto& [index, linear] : layers_) {
      x = linear->forward(x);
      if (index != last_layer_) x = torch::relu(x);
    }
    return {x};
  }

  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (auto& [index, linear] : layers_) {
      out.emplace_back(absl::StrCat(index, ".weight"), linear->weight);
      out.emplace_back(absl::StrCat(index, ".bias"), linear->bias);
    }
    return out;
  }

  void To(const torch::Device& device) override {
    for (auto& [index, linear] : layers_) linear->to(device);
  }

 private:
  std::vector<std::pair<int, torch::nn::Linear>> layers_;
  int last_layer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StageModel>> BuildMlpStage(const spec::BuiltinModel& model,
                                                          int first_layer, int end_layer) {
  const int layers = static_cast<int>(model.sizes.size()) - 1;
  if (model.family != "mlp" || layers < 1) {
    return absl::InvalidArgumentError("model.builtin: not an MLP with at least one layer");
  }
  if (first_layer < 0 || end_layer > layers || first_layer >= end_layer) {
    return absl::InvalidArgumentError(absl::StrCat("stage layers [", first_layer, ", ", end_layer,
                                                   ") are outside the MLP's ", layers, " layers"));
  }
  std::vector<std::pair<int, torch::nn::Linear>> kept;
  {
    std::lock_guard<std::mutex> lock(SeedMutex());
    torch::manual_seed(model.seed);
    for (int i = 0; i < end_layer; ++i) {
      torch::nn::Linear linear(torch::nn::LinearOptions(model.sizes[i], model.sizes[i + 1]));
      if (i >= first_layer) kept.emplace_back(i, std::move(linear));
    }
  }
  return std::unique_ptr<StageModel>(new MlpStage(std::move(kept), layers - 1));
}

}  // namespace stagecoach::model
