#include "worker/runtime/executor/fused_weight_grad.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "worker/runtime/device/torch_version.h"

namespace stagecoach::runtime {
namespace {

using torch::autograd::AccumulateGrad;
using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;
namespace generated = torch::autograd::generated;

// How many edges of the graph under `roots` (the roots' own included) lead to each node.
std::unordered_map<Node*, int> IncomingEdges(const torch::autograd::edge_list& roots) {
  std::unordered_map<Node*, int> incoming;
  std::vector<Node*> stack;
  auto visit = [&](const Edge& edge) {
    Node* node = edge.function.get();
    if (node == nullptr) return;
    if (incoming[node]++ == 0) stack.push_back(node);
  };
  for (const Edge& root : roots) visit(root);
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& edge : node->next_edges()) visit(edge);
  }
  return incoming;
}

bool HasNoHooks(Node& node) {
  bool none = node.pre_hooks().empty() && node.post_hooks().empty();
#if STAGECOACH_TORCH_AT_LEAST(2, 0)
  none = none && node.tensor_pre_hooks().empty() && node.retains_grad_hooks().empty();
#endif
  return none;
}

bool ParameterHasNoHooks(AccumulateGrad& accumulate) {
  bool none = HasNoHooks(accumulate) && torch::autograd::impl::hooks(accumulate.variable).empty();
#if STAGECOACH_TORCH_AT_LEAST(2, 1)
  none = none && torch::autograd::impl::post_acc_grad_hooks(accumulate.variable) == nullptr;
#endif
  return none;
}

// Whether .grad can take the product as AccumulateGrad would in place: dense float or double,
// contiguous, and (where it exists) of the parameter's dtype, device and sizes, contiguous.
bool FusableParameter(const torch::Tensor& param) {
  if (param.layout() != torch::kStrided || param.dim() != 2 || !param.is_contiguous()) {
    return false;
  }
  if (param.scalar_type() != torch::kFloat && param.scalar_type() != torch::kDouble) return false;
  const torch::Tensor& grad = param.grad();
  return !grad.defined() ||
         (grad.layout() == torch::kStrided && grad.scalar_type() == param.scalar_type() &&
          grad.device() == param.device() && grad.sizes() == param.sizes() && grad.is_contiguous());
}

// A product's weight gradient, computed into .grad when the product's node runs. `input` is
// the product's saved left operand (x of x @ mat2); `transposed` when mat2 is the parameter's
// W.t(), so the gradient is dY^T x (as autograd computes it for a column-major mat2), else
// x^T dY.
class FusedWeightGradHook : public torch::autograd::FunctionPreHook {
 public:
  FusedWeightGradHook(const SavedVariable* input, torch::Tensor param, bool transposed)
      : input_(input), param_(std::move(param)), transposed_(transposed) {}

  variable_list operator()(const variable_list& grads) override {
    const torch::Tensor& grad = grads.at(0);
    // As AccumulateGrad: nothing for a parameter that stopped requiring grad since the forward.
    if (!grad.defined() || !param_.requires_grad()) return grads;
    const torch::Tensor input = input_->unpack();
    const torch::Tensor lhs = transposed_ ? grad.t() : input.t();
    const torch::Tensor& rhs = transposed_ ? input : grad;
    torch::Tensor& accumulated = param_.mutable_grad();
    if (accumulated.defined()) {
      accumulated.addmm_(lhs, rhs);
    } else {
      accumulated = torch::mm(lhs, rhs);
    }
    return grads;
  }

 private:
  const SavedVariable* input_;  // owned by the node that owns this hook
  torch::Tensor param_;
  bool transposed_;
};

// The product nodes this fuses: the saved left operand and the index of the weight's edge.
struct Product {
  const SavedVariable* input = nullptr;
  size_t weight_edge = 0;
};

bool AsProduct(Node* node, Product& product) {
  if (auto* addmm = dynamic_cast<generated::AddmmBackward0*>(node)) {
    if (!addmm->alpha.equal(1)) return false;
    product = Product{&addmm->mat1_, 2};  // addmm(self, mat1, mat2)
    return true;
  }
  if (auto* mm = dynamic_cast<generated::MmBackward0*>(node)) {
    product = Product{&mm->self_, 1};  // mm(self, mat2)
    return true;
  }
  return false;
}

}  // namespace

int FuseWeightGradients(const torch::autograd::edge_list& roots) {
  const std::unordered_map<Node*, int> incoming = IncomingEdges(roots);
  auto reached_once = [&](Node* node) {
    auto it = incoming.find(node);
    return it != incoming.end() && it->second == 1;
  };
  // Decided on the whole graph first: cutting an edge can free the nodes behind it.
  struct Fusion {
    Node* node;
    size_t weight_edge;
    std::unique_ptr<FusedWeightGradHook> hook;
  };
  std::vector<Fusion> fusions;
  for (const auto& entry : incoming) {
    Node* node = entry.first;
    Product product;
    if (!AsProduct(node, product) || !node->post_hooks().empty()) continue;
    if (product.weight_edge >= node->num_outputs()) continue;
    Node* next = node->next_edge(product.weight_edge).function.get();
    const bool transposed = dynamic_cast<generated::TBackward0*>(next) != nullptr;
    if (transposed) {
      if (!reached_once(next) || !HasNoHooks(*next)) continue;
      next = next->next_edge(0).function.get();
    }
    auto* accumulate = dynamic_cast<AccumulateGrad*>(next);
    if (accumulate == nullptr || !reached_once(accumulate) || !ParameterHasNoHooks(*accumulate) ||
        !FusableParameter(accumulate->variable)) {
      continue;
    }
    // A sparse or MKLDNN input takes another formula in autograd.
    if (product.input->unpack().layout() != torch::kStrided) continue;
    fusions.push_back(Fusion{
        node, product.weight_edge,
        std::make_unique<FusedWeightGradHook>(product.input, accumulate->variable, transposed)});
  }
  for (Fusion& fusion : fusions) {
    fusion.node->add_pre_hook(std::move(fusion.hook));
    fusion.node->next_edges()[fusion.weight_edge] = Edge();
  }
  return static_cast<int>(fusions.size());
}

int FuseWeightGradients(const std::vector<torch::Tensor>& outputs) {
  torch::autograd::edge_list roots;
  for (const torch::Tensor& y : outputs) {
    if (y.requires_grad()) roots.push_back(torch::autograd::impl::gradient_edge(y));
  }
  return FuseWeightGradients(roots);
}

}  // namespace stagecoach::runtime
