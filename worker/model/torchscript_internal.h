// TorchScriptModel's private parts that its source files share (torchscript_model.cc: loading,
// analysis, stages; torchscript_split.cc: cutting the forward graph into stage graphs;
// torchscript_nesting.cc: opening nested modules into layers). Not for other callers.
#pragma once

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/model/torchscript_model.h"

namespace stagecoach::model {
namespace torchscript_internal {

using Graph = torch::jit::Graph;
using Node = torch::jit::Node;
using Value = torch::jit::Value;

// Whether `v` is a tensor.
bool IsTensor(const Value* v);
// Every node of `block`, nested blocks included, in program order.
void CollectNodes(torch::jit::Block* block, std::vector<Node*>* out);
// The top-level node of `graph` that holds `n` (n itself when it is top-level).
Node* TopLevel(Node* n, Graph* graph);
// Nodes that each stage repeats for itself instead of receiving their value: constants and reads
// of non-tensor attributes (submodules, ints, ...).
bool Replicable(const Node* n);
// The module at a qualified path ("blocks.0"; "" is `root` itself).
torch::jit::Module SubmoduleAt(const torch::jit::Module& root, const std::string& path);
// "prefix.name", or "name" when prefix is empty.
std::string Join(const std::string& prefix, const std::string& name);
// The attribute path from a graph's `self` to `v` ("blocks.0"), when `v` is `self` or a chain of
// GetAttr nodes from it.
std::optional<std::string> PathFromSelf(Value* v, Value* self);
// A node without side effects, randomness or blocks, so that a later stage may recompute it
// (used for non-tensor values such as sizes).
bool Recomputable(Node* n);

}  // namespace torchscript_internal

struct TorchScriptModel::Impl {
  using Graph = torchscript_internal::Graph;
  using Node = torchscript_internal::Node;
  using Value = torchscript_internal::Value;

  std::string field;
  std::string path;
  torch::jit::Module module;
  // The forward graph, with every tensor attribute read hoisted to the top level (one read per
  // attribute) and calls of self's own methods inlined.
  std::shared_ptr<Graph> graph;
  std::vector<ModelLayer> layers;
  std::unordered_map<std::string, int> layer_index;
  bool sequential = false;
  // graph's top-level nodes in order, and each one's index.
  std::vector<Node*> top;
  std::unordered_map<Node*, int> top_index;
  // Per layer: top-level indices of the nodes holding its calls (first call first).
  std::vector<std::vector<int>> layer_calls;
  // Hoisted tensor attribute reads: top-level node -> qualified attribute name.
  std::unordered_map<Node*, std::string> tensor_reads;
  // Loose tensors (those under no layer's module: the top-level module's own, opened modules'
  // own, and those of modules no layer calls), by owning layer.
  std::vector<std::vector<std::string>> layer_loose_tensors;
  // The names of the loose tensors that are parameters.
  std::set<std::string> loose_params;

  // Nested layers (torchscript_nesting.cc). Modules whose calls were inlined into the graph.
  std::set<std::string> opened;
  int64_t total_parameters = 0;
  // Per module path: the submodules its forward calls (its helper methods' calls included), and
  // whether it wraps a dominant stack of blocks; memoised.
  std::map<std::string, std::vector<std::string>> called;
  std::map<std::string, bool> dominant;

  // An attribute the forward assigns (prim::SetAttr), if any: such a forward is not split.
  std::string mutated;

  // The last Split.
  std::vector<int> first_layers;
  PipelineWiring wiring;
  std::vector<std::shared_ptr<Graph>> stage_graphs;  // empty for a sequential model
  std::vector<bool> released;

  absl::Status Analyse(const std::vector<std::string>& open_toward);
  void FindMutation();
  void HoistTensorReads();
  std::vector<Node*> FindLayers();
  void AssignLooseTensors();
  bool IsPlainChain(const std::vector<Node*>& first_call) const;
  void OpenNestedCalls(const std::vector<std::string>& toward);
  bool ShouldOpen(const std::string& path, const std::vector<std::string>& toward);
  bool WrapsDominantStack(const std::string& path);
  std::vector<std::string> CalledSubmodules(const std::string& path);
  std::vector<SplitCandidate> Candidates();
  absl::Status SplitGraph(const std::vector<int>& first_layers);
  int LayerEnd(int stage) const {
    return stage + 1 < static_cast<int>(first_layers.size()) ? first_layers[stage + 1]
                                                             : static_cast<int>(layers.size());
  }
  std::string Prefix() const { return absl::StrCat(field, ": '", path, "'"); }
};

}  // namespace stagecoach::model
