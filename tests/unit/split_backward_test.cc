// Split backward (worker/runtime/executor/split_backward.h): I then W gives exactly the gradients
// of one full backward, I never touches the parameters, W never re-runs the input path, and the
// graph is freed after W.
#include "worker/runtime/executor/split_backward.h"

#include <torch/torch.h>

#include <atomic>

#include "gtest/gtest.h"

namespace stagecoach::runtime::split_backward_test {
namespace {

// Identity whose backward counts its calls: put on the input path, it tells whether W ran
// the input path again.
std::atomic<int> g_identity_backwards{0};

struct CountingIdentity : public torch::autograd::Function<CountingIdentity> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor x) { return x; }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    ++g_identity_backwards;
    return {grads[0]};
  }
};

// A stage of three Linear layers with ReLU between them, plus a counting identity.
struct Stage {
  torch::nn::Linear l0{12, 16}, l1{16, 16}, l2{16, 5};

  explicit Stage(uint64_t seed) {
    torch::manual_seed(seed);
    l0 = torch::nn::Linear(12, 16);
    l1 = torch::nn::Linear(16, 16);
    l2 = torch::nn::Linear(16, 5);
  }
  torch::Tensor Forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(l0(x));
    h = CountingIdentity::apply(h);
    return l2(torch::relu(l1(h)));
  }
  std::vector<torch::Tensor> Parameters() {
    std::vector<torch::Tensor> out;
    for (auto* m : {&l0, &l1, &l2}) {
      for (auto& p : (*m)->parameters()) out.push_back(p);
    }
    return out;
  }
  std::vector<torch::Tensor> Grads() {
    std::vector<torch::Tensor> out;
    for (auto& p : Parameters()) out.push_back(p.grad().clone());
    return out;
  }
};

void ExpectSame(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << i;
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7)) << "gradient " << i << "\n"
                                                         << a[i] << "\n"
                                                         << b[i];
  }
}

torch::Tensor Input(uint64_t seed, bool requires_grad) {
  torch::manual_seed(seed);
  return torch::randn({8, 12}).requires_grad_(requires_grad);
}

TEST(SplitBackward, InputThenWeightEqualsFullBackward) {
  Stage full(1), split(1);
  const torch::Tensor grad_out = torch::randn({8, 5});

  torch::Tensor x_full = Input(7, true);
  torch::autograd::backward({full.Forward(x_full)}, {grad_out});

  torch::Tensor x_split = Input(7, true);
  torch::Tensor y = split.Forward(x_split);
  PendingWeightGrad pending;
  torch::Tensor dx = SplitBackward::BackwardInput({y}, {grad_out}, x_split, &pending);
  EXPECT_TRUE(torch::allclose(dx, x_full.grad(), 1e-6, 1e-7));
  for (auto& p : split.Parameters()) EXPECT_FALSE(p.grad().defined()) << "I touched a parameter";
  EXPECT_FALSE(x_split.grad().defined()) << "I accumulated into the input";

  SplitBackward::BackwardWeight(std::move(pending), /*fuse_weight_grads=*/false);
  ExpectSame(split.Grads(), full.Grads());
}

TEST(SplitBackward, WeightDoesNotRunTheInputPathAgain) {
  Stage stage(2);
  torch::Tensor x = Input(3, true);
  torch::Tensor y = stage.Forward(x);
  g_identity_backwards = 0;
  PendingWeightGrad pending;
  SplitBackward::BackwardInput({y}, {torch::ones_like(y)}, x, &pending);
  EXPECT_EQ(g_identity_backwards.load(), 1);
  SplitBackward::BackwardWeight(std::move(pending), /*fuse_weight_grads=*/false);
  EXPECT_EQ(g_identity_backwards.load(), 1) << "W ran the input path";
}

TEST(SplitBackward, FromALossWithInterleavedMicrobatches) {
  // Last stage: the root is the loss; I0 I1 W1 W0 accumulates what B0 B1 does.
  Stage full(4), split(4);
  const torch::Tensor target = torch::randn({8, 5});
  for (int mb = 0; mb < 2; ++mb) {
    torch::Tensor x = Input(10 + mb, true);
    torch::mse_loss(full.Forward(x), target).backward();
  }
  std::vector<PendingWeightGrad> pending(2);
  std::vector<torch::Tensor> inputs;
  for (int mb = 0; mb < 2; ++mb) {
    inputs.push_back(Input(10 + mb, true));
    torch::Tensor loss = torch::mse_loss(split.Forward(inputs[mb]), target);
    SplitBackward::BackwardInput({loss}, {torch::Tensor()}, inputs[mb], &pending[mb]);
  }
  SplitBackward::BackwardWeight(std::move(pending[1]), /*fuse_weight_grads=*/false);
  SplitBackward::BackwardWeight(std::move(pending[0]), /*fuse_weight_grads=*/false);
  ExpectSame(split.Grads(), full.Grads());
}

TEST(SplitBackward, FirstStageDefersEverythingToWeight) {
  Stage full(5), split(5);
  torch::Tensor grad_out = torch::randn({8, 5});
  torch::autograd::backward({full.Forward(Input(6, false))}, {grad_out});

  torch::Tensor y = split.Forward(Input(6, false));
  PendingWeightGrad pending;
  torch::Tensor dx = SplitBackward::BackwardInput({y}, {grad_out}, Input(6, false), &pending);
  EXPECT_FALSE(dx.defined());
  for (auto& p : split.Parameters()) EXPECT_FALSE(p.grad().defined());
  SplitBackward::BackwardWeight(std::move(pending), /*fuse_weight_grads=*/false);
  ExpectSame(split.Grads(), full.Grads());
}

TEST(SplitBackward, GraphIsFreedAfterWeight) {
  Stage stage(8);
  torch::Tensor x = Input(9, true);
  torch::Tensor y = stage.Forward(x);
  PendingWeightGrad pending;
  SplitBackward::BackwardInput({y}, {torch::ones_like(y)}, x, &pending);
  SplitBackward::BackwardWeight(std::move(pending), /*fuse_weight_grads=*/false);
  // The saved tensors are gone: a second backward through the same graph must fail.
  EXPECT_THROW(torch::autograd::backward({y}, {torch::ones_like(y)}), c10::Error);
}

// A stage of a graph-split model: two inputs (one needing no gradient), and outputs that include
// a parameter passed on as a value and a value that does not depend on any input. I gives each
// input's gradient; W then gives every parameter exactly the gradient of one full backward.
TEST(SplitBackwardTest, SeveralInputsAndOutputsOffTheInputPathMatchAFullBackward) {
  auto run = [](bool split, std::vector<torch::Tensor>* input_grads) {
    torch::manual_seed(5);
    torch::nn::Linear lin(4, 4);
    torch::Tensor scale = torch::randn({4}, torch::requires_grad());
    torch::Tensor x = torch::randn({3, 4}, torch::requires_grad());
    torch::Tensor mask = torch::randn({3, 4});  // needs no gradient
    torch::Tensor y = lin(x) * mask;
    torch::Tensor z = lin->bias * 2;  // off the input path
    std::vector<torch::Tensor> outs = {y, scale, z};
    torch::manual_seed(6);
    std::vector<torch::Tensor> grads = {torch::randn({3, 4}), torch::randn({4}), torch::randn({4})};
    if (split) {
      PendingWeightGrad pending;
      *input_grads = SplitBackward::BackwardInputs(outs, grads, {x, mask}, &pending);
      EXPECT_FALSE(lin->weight.grad().defined()) << "I touched a parameter";
      EXPECT_FALSE(scale.grad().defined()) << "I touched a parameter";
      SplitBackward::BackwardWeight(std::move(pending), /*fuse_weight_grads=*/false);
    } else {
      torch::autograd::backward(outs, grads);
      *input_grads = {x.grad(), torch::Tensor()};
    }
    return std::vector<torch::Tensor>{lin->weight.grad().clone(), lin->bias.grad().clone(),
                                      scale.grad().clone()};
  };
  std::vector<torch::Tensor> full_inputs, split_inputs;
  const std::vector<torch::Tensor> full = run(false, &full_inputs);
  const std::vector<torch::Tensor> split = run(true, &split_inputs);
  ExpectSame(split, full);
  ASSERT_EQ(split_inputs.size(), 2u);
  EXPECT_TRUE(torch::allclose(split_inputs[0], full_inputs[0]));
  EXPECT_FALSE(split_inputs[1].defined());
}

}  // namespace
}  // namespace stagecoach::runtime::split_backward_test
