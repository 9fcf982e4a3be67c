// Split backward of one stage on one microbatch, for the zero-bubble schedules' I and W
// actions (../shared/reference/backward-split.md; PyTorch's stage_backward_input and
// stage_backward_weight).
//
// I (BackwardInput) computes the gradient of the stage's input and stops there: it runs only
// the autograd nodes on the path from the stage's outputs to its input. At the "split nodes" —
// nodes on that path that also feed parameters (for a Linear layer, its addmm) — it captures
// the gradient arriving there and keeps those nodes' saved tensors; every other node on the
// input path releases its saved tensors at once.
//
// W (BackwardWeight) later runs only the rest: from the split nodes, with their input-path
// edges cut, to the parameters' AccumulateGrad nodes, accumulating into .grad. Nothing of the
// forward or of I is run again, so I + W costs about one full backward, and W frees the graph.
//
// A stage whose input needs no gradient (the first stage) has no input path: I does nothing
// and W runs the whole backward.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/types.h>

#include <memory>
#include <vector>

namespace stagecoach::runtime {

// What I leaves for W: the roots W starts from and the gradients arriving at them.
class PendingWeightGrad {
 public:
  PendingWeightGrad() = default;
  PendingWeightGrad(PendingWeightGrad&&) = default;
  PendingWeightGrad& operator=(PendingWeightGrad&&) = default;

 private:
  friend class SplitBackward;
  torch::autograd::edge_list roots_;
  std::vector<torch::Tensor> grads_;
  // Split nodes whose input-path edges W cuts before it runs.
  std::vector<std::shared_ptr<torch::autograd::Node>> split_nodes_;
  std::vector<std::vector<size_t>> input_path_edges_;
};

class SplitBackward {
 public:
  // I. `outputs` are the stage's outputs (or its loss), `output_grads` their gradients (an
  // undefined gradient is ones, for a scalar loss). `input` is the stage's input; when it
  // requires grad, returns the gradient of the input (zeros if it does not reach the outputs),
  // otherwise an undefined tensor. `pending` receives what W needs. Throws c10::Error from
  // LibTorch.
  static torch::Tensor BackwardInput(const std::vector<torch::Tensor>& outputs,
                                     const std::vector<torch::Tensor>& output_grads,
                                     const torch::Tensor& input, PendingWeightGrad* pending);

  // I of a stage with several inputs: the gradient of each input that requires grad (zeros if
  // it does not reach the outputs), undefined for the others.
  static std::vector<torch::Tensor> BackwardInputs(const std::vector<torch::Tensor>& outputs,
                                                   const std::vector<torch::Tensor>& output_grads,
                                                   const std::vector<torch::Tensor>& inputs,
                                                   PendingWeightGrad* pending);

  // W. Accumulates the parameter gradients into .grad and frees the rest of the graph.
  // `pending` is consumed. With `fuse_weight_grads`, Linear layers' weight gradients are
  // computed straight into .grad (fused_weight_grad.h); returns how many were. Throws
  // c10::Error from LibTorch.
  static int BackwardWeight(PendingWeightGrad pending, bool fuse_weight_grads);
};

}  // namespace stagecoach::runtime
