#include "worker/model/layer_chain.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"

namespace stagecoach::model {

OutputHead::OutputHead(int64_t hidden, int64_t vocab, double init_std)
    : weight_(register_parameter("weight", torch::empty({vocab, hidden}))) {
  torch::NoGradGuard no_grad;
  weight_.normal_(0.0, init_std);
}

OutputHead::OutputHead(torch::Tensor weight, bool own)
    : weight_(own ? register_parameter("weight", std::move(weight)) : std::move(weight)) {}

std::shared_ptr<OutputHead> OutputHead::Sharing(const torch::Tensor& embedding) {
  return std::shared_ptr<OutputHead>(new OutputHead(embedding, /*own=*/false));
}

std::shared_ptr<OutputHead> OutputHead::Copying(const torch::Tensor& embedding) {
  return std::shared_ptr<OutputHead>(new OutputHead(embedding.detach().clone(), /*own=*/true));
}

torch::Tensor OutputHead::forward(const torch::Tensor& x) { return torch::linear(x, weight_); }

std::vector<torch::Tensor> LayerChainStage::ForwardValues(
    const std::vector<torch::Tensor>& inputs) {
  torch::Tensor x = inputs.at(0);
  if (segments_.defined()) {
    TORCH_CHECK(segments_.size(0) == x.size(0) && segments_.size(1) == x.size(1),
                "the rows' segments are ", segments_.sizes(), " but the stage's input is ",
                x.sizes());
    const DecodePositions packed = DecodePositions::Packed(segments_.to(x.device()));
    for (auto& [name, layer] : layers_) x = layer->ForwardCached(x, packed, nullptr);
    return {x};
  }
  for (auto& [name, layer] : layers_) x = layer->forward(x);
  return {x};
}

bool LayerChainStage::SetSegments(const torch::Tensor& segments) {
  segments_ = segments;
  return true;
}

torch::Tensor LayerChainStage::ForwardCached(const torch::Tensor& x, const DecodePositions& at,
                                             StageKv& kv) {
  torch::Tensor y = x;
  for (auto& [name, layer] : layers_) y = layer->ForwardCached(y, at, &kv.For(name));
  return y;
}

std::vector<std::pair<std::string, torch::Tensor>> LayerChainStage::NamedParameters() {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& [name, layer] : layers_) {
    for (const auto& item : layer->named_parameters(/*recurse=*/true)) {
      out.emplace_back(absl::StrCat(name, ".", item.key()), item.value());
    }
  }
  return out;
}

void LayerChainStage::To(const torch::Device& device) {
  for (auto& [name, layer] : layers_) layer->to(device);
}

}  // namespace stagecoach::model
