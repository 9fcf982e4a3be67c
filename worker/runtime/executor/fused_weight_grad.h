// Fused weight-gradient accumulation: a Linear layer's weight gradient is computed straight
// into the parameter's .grad (Megatron-Core's gradient_accumulation_fusion, done here on
// LibTorch's autograd graph, for every device).
//
// In a plain backward, a matrix product's node (AddmmBackward0 for a Linear layer with a bias
// and a 2-d input, MmBackward0 without one or through matmul) computes the weight's gradient
// into a new tensor, and the parameter's AccumulateGrad then adds that into .grad: for every
// microbatch after a step's first, one more pass that reads two weight-sized tensors and writes
// one. Fused, the product adds into .grad within the GEMM (addmm_, beta 1); where .grad is not
// there yet (the step's first microbatch) the product becomes .grad, as AccumulateGrad would
// take it over.
//
// FuseWeightGradients(roots) is called just before the engine runs the graph under `roots`
// (a stage's whole backward, B, or its weight part, W). For each product whose weight operand
// is a parameter reached only through it — directly (x @ W) or through the TBackward0 of
// W.t() (a Linear layer) — it cuts that edge, so the node no longer computes the weight's
// gradient and nothing reaches the AccumulateGrad, and gives the node a pre-hook that computes
// the gradient into .grad when the engine reaches the node, from the node's incoming gradient
// and its saved input.
//
// Left to autograd, unchanged: a parameter the graph reaches by more than one edge (a weight
// used twice, a tied head) — autograd sums those before accumulating; a parameter, node or
// transpose with hooks of its own; a product with alpha ≠ 1; anything but a dense float or
// double parameter whose .grad, where it exists, has its dtype, device, sizes and a contiguous
// layout; a weight under autocast (a cast node lies between).
//
// Numerics: the same GEMM with the same operands as autograd's, with beta 1 instead of 0. The
// sum into .grad is rounded once per K block of the BLAS instead of once per microbatch: equal
// to the bit when a microbatch's rows fit one K block (Debian 12's and 13's OpenBLAS: up to 256
// rows, measured), otherwise within the last bits (the numerical contract's rtol 1e-5 holds
// either way).
//
// Not for the input part of a split backward (I): it would compute the weight gradient there.
// Not for a backward that records a graph (create_graph): the hook's GEMM records none.
// Call on the thread that then runs the backward, with nothing else using the graph.
#pragma once

#include <torch/csrc/autograd/edge.h>
#include <torch/types.h>

#include <vector>

namespace stagecoach::runtime {

// Returns how many products it fused.
int FuseWeightGradients(const torch::autograd::edge_list& roots);

// The same for the graph a backward from `outputs` runs: the gradient edges of those that
// require grad.
int FuseWeightGradients(const std::vector<torch::Tensor>& outputs);

}  // namespace stagecoach::runtime
