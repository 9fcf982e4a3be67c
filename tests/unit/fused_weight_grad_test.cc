// Fused weight-gradient accumulation (worker/runtime/executor/fused_weight_grad.h): a backward with
// the weight gradients computed straight into .grad gives autograd's own gradients (same model,
// same inputs, no fusion), over several microbatches accumulating; it fuses exactly the
// products it claims to, and leaves to autograd the ones it must (a weight used twice, a hook,
// alpha ≠ 1, a .grad of another layout); the weight part of a split backward fuses too.
#include "worker/runtime/executor/fused_weight_grad.h"

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "gtest/gtest.h"
#include "worker/runtime/executor/split_backward.h"

namespace stagecoach::runtime::fused_weight_grad_test {
namespace {

int Fuse(const torch::Tensor& output) {
  return FuseWeightGradients(std::vector<torch::Tensor>{output});
}

void ExpectClose(const torch::Tensor& fused, const torch::Tensor& reference, const char* what) {
  ASSERT_TRUE(fused.defined()) << what;
  ASSERT_TRUE(reference.defined()) << what;
  EXPECT_TRUE(torch::allclose(fused, reference, 1e-6, 1e-7)) << what << "\n"
                                                             << fused << "\n"
                                                             << reference;
}

// Parameters built from one seed, so that two copies start equal.
std::vector<torch::Tensor> Params(uint64_t seed, const std::vector<std::vector<int64_t>>& shapes,
                                  torch::ScalarType dtype = torch::kFloat) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> out;
  for (const auto& shape : shapes) {
    out.push_back(torch::randn(shape, torch::TensorOptions().dtype(dtype)).requires_grad_(true));
  }
  return out;
}

using Forward =
    std::function<torch::Tensor(const std::vector<torch::Tensor>& params, const torch::Tensor& x)>;

// Runs `microbatches` backwards of `forward` on two copies of the parameters, one fused and one
// not, and compares every parameter's and input's gradient. Returns how many products each
// fused backward fused (the first microbatch's; every one must fuse alike).
int CompareOverMicrobatches(const Forward& forward, const std::vector<std::vector<int64_t>>& shapes,
                            const std::vector<int64_t>& input_shape, int microbatches = 3,
                            torch::ScalarType dtype = torch::kFloat) {
  std::vector<torch::Tensor> fused = Params(1, shapes, dtype);
  std::vector<torch::Tensor> plain = Params(1, shapes, dtype);
  int first_count = -1;
  for (int mb = 0; mb < microbatches; ++mb) {
    torch::manual_seed(100 + mb);
    const torch::Tensor x0 = torch::randn(input_shape, torch::TensorOptions().dtype(dtype));
    torch::Tensor x_fused = x0.clone().requires_grad_(true);
    torch::Tensor x_plain = x0.clone().requires_grad_(true);
    torch::Tensor y_fused = forward(fused, x_fused);
    torch::Tensor y_plain = forward(plain, x_plain);
    const torch::Tensor grad = torch::randn_like(y_plain);
    const int count = Fuse(y_fused);
    if (first_count < 0) first_count = count;
    EXPECT_EQ(count, first_count) << "microbatch " << mb;
    torch::autograd::backward({y_fused}, {grad});
    torch::autograd::backward({y_plain}, {grad});
    ExpectClose(x_fused.grad(), x_plain.grad(), "input gradient");
    for (size_t p = 0; p < fused.size(); ++p) {
      ExpectClose(fused[p].grad(), plain[p].grad(), "parameter gradient");
    }
  }
  return first_count;
}

// One Linear layer's backward on `param` (Fuse first) and on `reference`
// (plain autograd), from the same input and output gradient; returns how many products it fused.
int LinearBackwardOnBoth(const torch::Tensor& param, const torch::Tensor& reference) {
  const torch::Tensor x = torch::randn({3, param.size(1)});
  torch::Tensor y = torch::nn::functional::linear(x, param);
  const int fused = Fuse(y);
  const torch::Tensor grad = torch::randn_like(y);
  torch::autograd::backward({y}, {grad});
  torch::autograd::backward({torch::nn::functional::linear(x, reference)}, {grad});
  return fused;
}

TEST(FusedWeightGrad, LinearLayersMatchAutogradOverMicrobatches) {
  // Three Linear layers with biases and ReLU between: addmm with W.t() each.
  const Forward mlp = [](const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
    torch::Tensor h = torch::relu(torch::nn::functional::linear(x, p[0], p[1]));
    h = torch::relu(torch::nn::functional::linear(h, p[2], p[3]));
    return torch::nn::functional::linear(h, p[4], p[5]);
  };
  EXPECT_EQ(CompareOverMicrobatches(mlp, {{16, 12}, {16}, {16, 16}, {16}, {5, 16}, {5}}, {8, 12}),
            3);
}

TEST(FusedWeightGrad, AnInputWithoutGradientAsOnTheFirstStage) {
  // The products' input edges are empty: only their weights (and biases) need gradients.
  std::vector<torch::Tensor> fused = Params(5, {{7, 3}, {7}, {2, 7}});
  std::vector<torch::Tensor> plain = Params(5, {{7, 3}, {7}, {2, 7}});
  for (int mb = 0; mb < 2; ++mb) {
    const torch::Tensor x = torch::randn({4, 3});
    const torch::Tensor grad = torch::randn({4, 2});
    torch::Tensor y = torch::nn::functional::linear(
        torch::relu(torch::nn::functional::linear(x, fused[0], fused[1])), fused[2]);
    EXPECT_EQ(Fuse(y), 2);
    torch::autograd::backward({y}, {grad});
    torch::autograd::backward(
        {torch::nn::functional::linear(
            torch::relu(torch::nn::functional::linear(x, plain[0], plain[1])), plain[2])},
        {grad});
    for (size_t p = 0; p < fused.size(); ++p) {
      ExpectClose(fused[p].grad(), plain[p].grad(), "parameter gradient");
    }
  }
}

TEST(FusedWeightGrad, ARetainedGraphFusedOnceServesEveryBackward) {
  // As InspectModel times B: fused once, run three times with the graph kept.
  std::vector<torch::Tensor> fused = Params(6, {{5, 4}, {5}});
  std::vector<torch::Tensor> plain = Params(6, {{5, 4}, {5}});
  const torch::Tensor x = torch::randn({3, 4});
  const torch::Tensor grad = torch::randn({3, 5});
  torch::Tensor y_fused = torch::nn::functional::linear(x, fused[0], fused[1]);
  torch::Tensor y_plain = torch::nn::functional::linear(x, plain[0], plain[1]);
  EXPECT_EQ(Fuse(y_fused), 1);
  EXPECT_EQ(Fuse(y_fused), 0) << "fused the same product twice";
  for (int r = 0; r < 3; ++r) {
    torch::autograd::backward({y_fused}, {grad}, /*retain_graph=*/true);
    torch::autograd::backward({y_plain}, {grad}, /*retain_graph=*/true);
  }
  for (size_t p = 0; p < fused.size(); ++p) {
    ExpectClose(fused[p].grad(), plain[p].grad(), "parameter gradient");
  }
}

TEST(FusedWeightGrad, DoubleParametersFuseToo) {
  const Forward linear = [](const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
    return torch::nn::functional::linear(x, p[0], p[1]);
  };
  EXPECT_EQ(CompareOverMicrobatches(linear, {{6, 4}, {6}}, {5, 4}, 3, torch::kDouble), 1);
}

TEST(FusedWeightGrad, WithoutBiasAndOnThreeDimensionalInput) {
  // No bias: mm. A 3-d input: matmul folds it into mm on 2-d rows.
  const Forward f = [](const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
    torch::Tensor h = torch::nn::functional::linear(x, p[0]);
    return torch::nn::functional::linear(torch::tanh(h), p[1], p[2]);
  };
  EXPECT_EQ(CompareOverMicrobatches(f, {{10, 6}, {3, 10}, {3}}, {2, 7, 6}), 2);
}

TEST(FusedWeightGrad, AWeightUsedUntransposed) {
  // x @ W: the product's right operand is the parameter itself, no transpose between.
  const Forward f = [](const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
    return torch::mm(x, p[0]);
  };
  EXPECT_EQ(CompareOverMicrobatches(f, {{4, 9}}, {6, 4}), 1);
}

TEST(FusedWeightGrad, AWeightUsedTwiceIsLeftToAutograd) {
  // Autograd sums the two uses before accumulating; fusing one would round differently.
  const Forward f = [](const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
    torch::Tensor h = torch::nn::functional::linear(x, p[0]);
    return torch::nn::functional::linear(torch::relu(h), p[0], p[1]);
  };
  EXPECT_EQ(CompareOverMicrobatches(f, {{8, 8}, {8}}, {4, 8}), 0);
}

TEST(FusedWeightGrad, AlphaOtherThanOneIsLeftToAutograd) {
  const Forward f = [](const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
    return torch::addmm(p[1], x, p[0].t(), /*beta=*/1, /*alpha=*/2);
  };
  EXPECT_EQ(CompareOverMicrobatches(f, {{5, 3}, {5}}, {4, 3}), 0);
}

TEST(FusedWeightGrad, AParameterWithAHookIsLeftToAutogradAndTheHookRuns) {
  std::vector<torch::Tensor> p = Params(2, {{6, 4}});
  int calls = 0;
  p[0].register_hook([&calls](torch::Tensor g) {
    ++calls;
    return g * 2;
  });
  std::vector<torch::Tensor> reference = Params(2, {{6, 4}});
  EXPECT_EQ(LinearBackwardOnBoth(p[0], reference[0]), 0);
  EXPECT_EQ(calls, 1);
  ExpectClose(p[0].grad(), reference[0].grad() * 2, "hooked gradient");
}

TEST(FusedWeightGrad, AGradOfAnotherLayoutIsLeftToAutograd) {
  // A transposed (column-major) .grad: AccumulateGrad adds into it as it is; so does autograd.
  std::vector<torch::Tensor> p = Params(3, {{6, 4}});
  std::vector<torch::Tensor> reference = Params(3, {{6, 4}});
  p[0].mutable_grad() = torch::ones({4, 6}).t();
  reference[0].mutable_grad() = torch::ones({6, 4});
  EXPECT_EQ(LinearBackwardOnBoth(p[0], reference[0]), 0);
  ExpectClose(p[0].grad(), reference[0].grad(), "gradient into a transposed .grad");
}

TEST(FusedWeightGrad, SplitBackwardWeightPartFuses) {
  // I, then W with fusion, over two microbatches, against plain full backwards.
  const Forward mlp = [](const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
    torch::Tensor h = torch::relu(torch::nn::functional::linear(x, p[0], p[1]));
    return torch::nn::functional::linear(h, p[2], p[3]);
  };
  const std::vector<std::vector<int64_t>> shapes = {{16, 12}, {16}, {5, 16}, {5}};
  std::vector<torch::Tensor> split = Params(4, shapes);
  std::vector<torch::Tensor> full = Params(4, shapes);
  for (int mb = 0; mb < 2; ++mb) {
    const torch::Tensor x0 = torch::randn({8, 12});
    torch::Tensor x_split = x0.clone().requires_grad_(true);
    torch::Tensor x_full = x0.clone().requires_grad_(true);
    torch::Tensor y = mlp(split, x_split);
    const torch::Tensor grad = torch::randn_like(y);
    PendingWeightGrad pending;
    const torch::Tensor dx = SplitBackward::BackwardInput({y}, {grad}, x_split, &pending);
    if (mb == 0) {
      for (const torch::Tensor& param : split) {
        EXPECT_FALSE(param.grad().defined()) << "I touched a parameter";
      }
    }
    EXPECT_EQ(SplitBackward::BackwardWeight(std::move(pending), /*fuse_weight_grads=*/true), 2);
    torch::autograd::backward({mlp(full, x_full)}, {grad});
    ExpectClose(dx, x_full.grad(), "input gradient");
    for (size_t p = 0; p < split.size(); ++p) {
      ExpectClose(split[p].grad(), full[p].grad(), "parameter gradient");
    }
  }
}

}  // namespace
}  // namespace stagecoach::runtime::fused_weight_grad_test
