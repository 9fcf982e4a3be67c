#include "worker/runtime/executor/split_backward.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "worker/runtime/executor/fused_weight_grad.h"

namespace stagecoach::runtime {
namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;

// Which nodes of the graph under `roots` lie on a path to one of `targets` (the inputs' nodes).
// Iterative depth-first search: stage graphs can be deep.
std::unordered_map<Node*, bool> NodesReaching(const edge_list& roots,
                                              const std::unordered_set<Node*>& targets) {
  std::unordered_map<Node*, bool> reaches;
  std::unordered_set<Node*> open;
  std::vector<std::pair<Node*, size_t>> stack;  // node, next edge to look at
  for (const Edge& root : roots) {
    Node* start = root.function.get();
    if (start == nullptr || reaches.count(start) > 0) continue;
    open.insert(start);
    stack.emplace_back(start, 0);
    while (!stack.empty()) {
      Node* node = stack.back().first;
      const size_t next = stack.back().second;
      const bool is_target = targets.count(node) > 0;
      if (!is_target && next < node->num_outputs()) {
        ++stack.back().second;
        Node* child = node->next_edge(next).function.get();
        if (child != nullptr && reaches.count(child) == 0 && open.count(child) == 0) {
          open.insert(child);
          stack.emplace_back(child, 0);
        }
        continue;
      }
      bool on_path = is_target;
      for (const Edge& edge : node->next_edges()) {
        if (edge.function == nullptr) continue;
        auto it = reaches.find(edge.function.get());
        if (it != reaches.end() && it->second) on_path = true;
      }
      reaches[node] = on_path;
      open.erase(node);
      stack.pop_back();
    }
  }
  return reaches;
}

// The graph's roots for `outputs` that require grad, and the gradient arriving at each (ones for
// an undefined one: a scalar loss).
void GradientRoots(const std::vector<torch::Tensor>& outputs,
                   const std::vector<torch::Tensor>& output_grads, edge_list& roots,
                   std::vector<torch::Tensor>& grads) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].requires_grad()) continue;
    roots.push_back(torch::autograd::impl::gradient_edge(outputs[i]));
    grads.push_back(output_grads[i].defined() ? output_grads[i] : torch::ones_like(outputs[i]));
  }
}

bool OnPath(const std::unordered_map<Node*, bool>& on_path, Node* node) {
  auto it = on_path.find(node);
  return it != on_path.end() && it->second;
}

// Split nodes: on the input path and feeding something off it (parameters), each with the
// indices of its edges that stay on the input path.
struct SplitNodes {
  std::vector<std::shared_ptr<Node>> nodes;
  std::vector<std::vector<size_t>> input_path_edges;
};

SplitNodes FindSplitNodes(const std::unordered_map<Node*, bool>& on_path,
                          const std::unordered_set<Node*>& targets) {
  SplitNodes split;
  for (const auto& [node, reaches] : on_path) {
    if (!reaches || targets.count(node) > 0) continue;
    std::vector<size_t> input_path_edges;
    bool feeds_off_path = false;
    for (size_t i = 0; i < node->num_outputs(); ++i) {
      Node* child = node->next_edge(i).function.get();
      if (child == nullptr) continue;
      if (OnPath(on_path, child)) {
        input_path_edges.push_back(i);
      } else {
        feeds_off_path = true;
      }
    }
    if (!feeds_off_path) continue;
    // `node` is in the graph, so it is owned by a shared_ptr; keep it for W.
    split.nodes.push_back(node->shared_from_this());
    split.input_path_edges.push_back(std::move(input_path_edges));
  }
  return split;
}

// A captured edge that is itself a root (a split node, or an input the stage returns as an
// output) receives the root's gradient, not a captured one.
void FillRootCaptures(const edge_list& roots, const std::vector<torch::Tensor>& grads,
                      const edge_list& captures, torch::autograd::variable_list& captured) {
  for (size_t c = 0; c < captures.size(); ++c) {
    if (captured[c].defined()) continue;
    for (size_t r = 0; r < roots.size(); ++r) {
      if (roots[r].function == captures[c].function && roots[r].input_nr == captures[c].input_nr) {
        captured[c] = grads[r];
      }
    }
  }
}

// Nodes on the input path that W will not run: their saved tensors can go now.
void ReleaseInputPath(const std::unordered_map<Node*, bool>& on_path,
                      const std::vector<std::shared_ptr<Node>>& split_nodes,
                      const std::unordered_set<Node*>& targets) {
  std::unordered_set<Node*> split(split_nodes.size());
  for (const auto& node : split_nodes) split.insert(node.get());
  for (const auto& [node, reaches] : on_path) {
    if (reaches && split.count(node) == 0 && targets.count(node) == 0) node->release_variables();
  }
}

}  // namespace

torch::Tensor SplitBackward::BackwardInput(const std::vector<torch::Tensor>& outputs,
                                           const std::vector<torch::Tensor>& output_grads,
                                           const torch::Tensor& input, PendingWeightGrad* pending) {
  std::vector<torch::Tensor> grads = BackwardInputs(outputs, output_grads, {input}, pending);
  return grads[0];
}

std::vector<torch::Tensor> SplitBackward::BackwardInputs(
    const std::vector<torch::Tensor>& outputs, const std::vector<torch::Tensor>& output_grads,
    const std::vector<torch::Tensor>& inputs, PendingWeightGrad* pending) {
  TORCH_CHECK(outputs.size() == output_grads.size(), "split backward: ", outputs.size(),
              " outputs but ", output_grads.size(), " gradients");
  edge_list roots;
  std::vector<torch::Tensor> grads;
  GradientRoots(outputs, output_grads, roots, grads);
  *pending = PendingWeightGrad();
  // The inputs that need a gradient, and their nodes.
  std::vector<size_t> wanted;
  edge_list captures;
  std::unordered_set<Node*> targets;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requires_grad()) continue;
    wanted.push_back(i);
    captures.push_back(torch::autograd::impl::gradient_edge(inputs[i]));
    targets.insert(captures.back().function.get());
  }
  std::vector<torch::Tensor> result(inputs.size());
  if (wanted.empty()) {
    // No input path: W runs the whole backward.
    pending->roots_ = std::move(roots);
    pending->grads_ = std::move(grads);
    return result;
  }
  if (roots.empty()) {
    for (size_t i : wanted) result[i] = torch::zeros_like(inputs[i]);
    return result;
  }

  const std::unordered_map<Node*, bool> on_path = NodesReaching(roots, targets);

  // Roots off the input path (a parameter the stage passes on as a value, a branch that does
  // not depend on any input) are W's alone.
  edge_list input_roots;
  std::vector<torch::Tensor> input_root_grads;
  for (size_t r = 0; r < roots.size(); ++r) {
    if (OnPath(on_path, roots[r].function.get())) {
      input_roots.push_back(roots[r]);
      input_root_grads.push_back(grads[r]);
    } else {
      pending->roots_.push_back(roots[r]);
      pending->grads_.push_back(grads[r]);
    }
  }
  roots = std::move(input_roots);
  grads = std::move(input_root_grads);
  if (roots.empty()) {
    for (size_t i : wanted) result[i] = torch::zeros_like(inputs[i]);
    return result;
  }

  // The gradients arriving at the split nodes are captured for W.
  const size_t num_input_captures = captures.size();
  SplitNodes split = FindSplitNodes(on_path, targets);
  for (const std::shared_ptr<Node>& node : split.nodes) {
    for (uint32_t i = 0; i < node->num_inputs(); ++i) captures.emplace_back(node, i);
  }
  pending->split_nodes_ = std::move(split.nodes);
  pending->input_path_edges_ = std::move(split.input_path_edges);

  torch::autograd::variable_list captured = torch::autograd::Engine::get_default_engine().execute(
      roots, grads, /*keep_graph=*/true, /*create_graph=*/false, /*accumulate_grad=*/false,
      captures);

  FillRootCaptures(roots, grads, captures, captured);
  for (size_t c = num_input_captures; c < captures.size(); ++c) {
    if (!captured[c].defined()) continue;
    pending->roots_.push_back(captures[c]);
    pending->grads_.push_back(std::move(captured[c]));
  }
  ReleaseInputPath(on_path, pending->split_nodes_, targets);
  for (size_t w = 0; w < wanted.size(); ++w) {
    const size_t i = wanted[w];
    result[i] = captured[w].defined() ? captured[w] : torch::zeros_like(inputs[i]);
  }
  return result;
}

int SplitBackward::BackwardWeight(PendingWeightGrad pending, bool fuse_weight_grads) {
  // Cut the split nodes' edges towards the input, or W would walk back to it and add the
  // input-path contributions again.
  for (size_t i = 0; i < pending.split_nodes_.size(); ++i) {
    for (size_t e : pending.input_path_edges_[i]) pending.split_nodes_[i]->next_edges()[e] = Edge();
  }
  if (pending.roots_.empty()) return 0;
  const int fused = fuse_weight_grads ? FuseWeightGradients(pending.roots_) : 0;
  torch::autograd::Engine::get_default_engine().execute(pending.roots_, pending.grads_,
                                                        /*keep_graph=*/false,
                                                        /*create_graph=*/false,
                                                        /*accumulate_grad=*/true, {});
  return fused;
}

}  // namespace stagecoach::runtime
