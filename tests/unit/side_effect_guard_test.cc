// SideEffectGuard (worker/runtime/executor/side_effect_guard.h): a stage run under the guard
// leaves its BatchNorm's running statistics and count and the default generator as they were; a
// recomputed forward under it still backpropagates (the buffers, which BatchNorm's backward saves,
// are restored without bumping their version counters); and the guard's restore is what PyTorch
// would compute without the extra run.
#include "worker/runtime/executor/side_effect_guard.h"

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace stagecoach::runtime::side_effect_guard_test {
namespace {

// A stage of one BatchNorm1d and a random draw (as dropout would make).
class NormStage : public model::StageModel {
 public:
  NormStage() : norm_(torch::nn::BatchNorm1dOptions(3)) {}
  std::vector<torch::Tensor> ForwardValues(const std::vector<torch::Tensor>& inputs) override {
    draws_.push_back(torch::rand({1}).item<double>());
    return {norm_->forward(inputs[0])};
  }
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() override {
    return {{"norm.weight", norm_->weight}, {"norm.bias", norm_->bias}};
  }
  std::vector<std::pair<std::string, torch::Tensor>> NamedBuffers() override {
    return {{"norm.running_mean", norm_->running_mean},
            {"norm.running_var", norm_->running_var},
            {"norm.num_batches_tracked", norm_->num_batches_tracked}};
  }
  void To(const torch::Device&) override {}
  std::vector<double> draws_;

 private:
  torch::nn::BatchNorm1d norm_;
};

std::vector<torch::Tensor> Copies(NormStage& stage) {
  std::vector<torch::Tensor> out;
  for (auto& [name, b] : stage.NamedBuffers()) out.push_back(b.clone());
  return out;
}

TEST(SideEffectGuard, AProbeLeavesBuffersAndTheGeneratorAsTheyWere) {
  torch::manual_seed(1);
  NormStage stage;
  const std::vector<torch::Tensor> before = Copies(stage);
  const torch::Tensor x = torch::randn({4, 3});
  {
    SideEffectGuard guard(stage, torch::kCPU);
    stage.ForwardValues({torch::zeros({4, 3})});
    EXPECT_EQ(stage.NamedBuffers()[2].second.item<int64_t>(), 1) << "the forward did update";
  }
  const std::vector<torch::Tensor> after = Copies(stage);
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(before[i], after[i])) << stage.NamedBuffers()[i].first;
  }
  // The draw after the guard is the draw the probe made: the generator was put back.
  stage.ForwardValues({x});
  ASSERT_EQ(stage.draws_.size(), 2u);
  EXPECT_EQ(stage.draws_[0], stage.draws_[1]);
}

TEST(SideEffectGuard, ARecomputedForwardBackpropagatesAndCountsOnce) {
  torch::manual_seed(2);
  NormStage stage, plain;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < 2; ++i) {
      plain.NamedParameters()[i].second.copy_(stage.NamedParameters()[i].second);
    }
  }
  const torch::Tensor x = torch::randn({5, 3});
  // The step's forward without a graph (activation checkpointing), then the recomputation with
  // one under the guard, then its backward.
  {
    torch::NoGradGuard no_grad;
    stage.ForwardValues({x});
  }
  torch::Tensor y;
  {
    SideEffectGuard once(stage, torch::kCPU);
    y = stage.ForwardValues({x})[0];
  }
  ASSERT_NO_THROW(y.pow(2).sum().backward());
  // Plain PyTorch: one forward with a graph, its backward.
  torch::Tensor want = plain.ForwardValues({x})[0];
  want.pow(2).sum().backward();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(torch::equal(stage.NamedBuffers()[i].second, plain.NamedBuffers()[i].second))
        << stage.NamedBuffers()[i].first;
  }
  EXPECT_TRUE(torch::allclose(stage.NamedParameters()[0].second.grad(),
                              plain.NamedParameters()[0].second.grad()));
}

}  // namespace
}  // namespace stagecoach::runtime::side_effect_guard_test
