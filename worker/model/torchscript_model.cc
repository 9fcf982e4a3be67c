// TorchScriptModel: loads a user's TorchScript file, lists its layers (the submodule calls of its
// top-level forward), and cuts it into pipeline stages: a sequential model into runs of its
// layers' submodules, any other model into stage graphs cut from the forward graph.
//
// Stage graphs and submodule forwards run through TorchScript's interpreter with the graph
// executor's optimisation off (GraphOptimizerEnabledGuard), so that under grad mode autograd
// records ordinary ATen nodes (no DifferentiableGraph, no fusion) that the runtime's split
// backward can walk.
#include "worker/model/torchscript_model.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/util/status_macros.h"
#include "worker/model/torchscript_internal.h"

namespace stagecoach::model {

namespace torchscript_internal {

bool IsTensor(const Value* v) { return v->type()->isSubtypeOf(*c10::TensorType::get()); }

void CollectNodes(torch::jit::Block* block, std::vector<Node*>* out) {
  for (Node* n : block->nodes()) {
    out->push_back(n);
    for (torch::jit::Block* b : n->blocks()) CollectNodes(b, out);
  }
}

Node* TopLevel(Node* n, Graph* graph) {
  while (n->owningBlock() != graph->block()) n = n->owningBlock()->owningNode();
  return n;
}

bool Replicable(const Node* n) {
  if (n->kind() == c10::prim::Constant) return true;
  return n->kind() == c10::prim::GetAttr && !IsTensor(n->output());
}

bool Recomputable(Node* n) {
  return n->blocks().empty() && !n->hasSideEffects() && !n->isNondeterministic();
}

torch::jit::Module SubmoduleAt(const torch::jit::Module& root, const std::string& path) {
  torch::jit::Module m = root;
  if (path.empty()) return m;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    m = m.attr(std::string(part)).toModule();
  }
  return m;
}

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : absl::StrCat(prefix, ".", name);
}

std::optional<std::string> PathFromSelf(Value* v, Value* self) {
  std::vector<std::string> parts;
  while (v != self) {
    Node* n = v->node();
    if (n->kind() != c10::prim::GetAttr) return std::nullopt;
    parts.push_back(n->s(c10::attr::name));
    v = n->input(0);
  }
  std::reverse(parts.begin(), parts.end());
  return absl::StrJoin(parts, ".");
}

}  // namespace torchscript_internal

namespace {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;
using torchscript_internal::CollectNodes;
using torchscript_internal::IsTensor;
using torchscript_internal::Recomputable;
using torchscript_internal::Replicable;
using torchscript_internal::TopLevel;

using torchscript_internal::Join;
using torchscript_internal::PathFromSelf;
using torchscript_internal::SubmoduleAt;

// Splits "a.b.c" into ("a.b", "c").
std::pair<std::string, std::string> SplitLast(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {"", name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

absl::Status TorchError(const std::string& what, const std::exception& e) {
  std::string message = e.what();
  // c10::Error messages carry a C++ backtrace after the first line of interest.
  const size_t cut = message.find("\nException raised from");
  if (cut != std::string::npos) message.resize(cut);
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", message));
}

// Runs a GraphFunction (or a method) with the graph executor's optimisation off (a thread-local
// setting), so that it records ordinary ATen autograd nodes.
std::vector<c10::IValue> RunPlain(torch::jit::Function& fn, torch::jit::Stack stack) {
  torch::jit::GraphOptimizerEnabledGuard plain(false);
  fn.run(stack);
  return stack;
}

enum class TensorKind { kParameters, kBuffers, kBoth };

// The parameters, the buffers or both (parameters first) of the module at `path`, named in the
// whole model; with `recurse` false, only the module's own.
std::vector<std::pair<std::string, torch::Tensor>> NamedTensorsOf(const torch::jit::Module& root,
                                                                  const std::string& path,
                                                                  TensorKind kind,
                                                                  bool recurse = true) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  torch::jit::Module m = SubmoduleAt(root, path);
  if (kind != TensorKind::kBuffers) {
    for (const auto& p : m.named_parameters(recurse)) out.emplace_back(Join(path, p.name), p.value);
  }
  if (kind != TensorKind::kParameters) {
    for (const auto& b : m.named_buffers(recurse)) out.emplace_back(Join(path, b.name), b.value);
  }
  return out;
}

// A stage's tensors: those of its layers' submodules and the loose tensors its layers own.
class TorchScriptStage : public StageModel {
 public:
  // `opened`: the opened modules above the stage's layers (and the top-level module, ""), whose
  // inlined code the stage runs.
  TorchScriptStage(torch::jit::Module root, std::vector<std::string> layers,
                   std::vector<std::string> loose_tensors, std::vector<std::string> opened)
      : root_(std::move(root)),
        layers_(std::move(layers)),
        loose_tensors_(loose_tensors.begin(), loose_tensors.end()),
        opened_(std::move(opened)) {}

  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() override {
    return Owned(TensorKind::kParameters);
  }

  std::vector<std::pair<std::string, torch::Tensor>> NamedBuffers() override {
    return Owned(TensorKind::kBuffers);
  }

  void To(const torch::Device& device) override {
    for (const std::string& name : layers_) SubmoduleAt(root_, name).to(device);
    torch::NoGradGuard no_grad;
    for (const std::string& name : loose_tensors_) {
      auto [owner, attr] = SplitLast(name);
      torch::Tensor t = SubmoduleAt(root_, owner).attr(attr).toTensor();
      t.set_data(t.to(device));
    }
  }

  void SetTraining(bool training) override {
    for (const std::string& name : layers_) SubmoduleAt(root_, name).train(training);
    // Only the opened modules' own flag: train() would recurse into other stages' layers.
    for (const std::string& name : opened_) {
      torch::jit::Module m = SubmoduleAt(root_, name);
      if (auto slot = m._ivalue()->type()->findAttributeSlot("training")) {
        m._ivalue()->setSlot(*slot, training);
      }
    }
  }

 private:
  // The stage's tensors of `kind`: its layers' submodules', then its loose ones.
  std::vector<std::pair<std::string, torch::Tensor>> Owned(TensorKind kind) {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const std::string& name : layers_) {
      for (auto& t : NamedTensorsOf(root_, name, kind)) out.push_back(std::move(t));
    }
    if (loose_tensors_.empty()) return out;
    for (auto& t : NamedTensorsOf(root_, "", kind)) {
      if (loose_tensors_.count(t.first)) out.push_back(std::move(t));
    }
    return out;
  }

 protected:
  torch::jit::Module root_;
  std::vector<std::string> layers_;
  std::set<std::string> loose_tensors_;
  std::vector<std::string> opened_;
};

// A stage of a sequential model: its layers' submodules called in turn.
class SequentialStage : public TorchScriptStage {
 public:
  using TorchScriptStage::TorchScriptStage;

  std::vector<torch::Tensor> ForwardValues(const std::vector<torch::Tensor>& inputs) override {
    if (inputs.size() != 1) {
      throw std::invalid_argument(
          absl::StrCat("a sequential TorchScript stage takes 1 input, got ", inputs.size()));
    }
    torch::Tensor x = inputs[0];
    for (const std::string& name : layers_) {
      torch::jit::Module m = SubmoduleAt(root_, name);
      torch::jit::Method forward = m.get_method("forward");
      std::vector<c10::IValue> out = RunPlain(forward.function(), {m._ivalue(), x});
      x = out.at(0).toTensor();
    }
    return {x};
  }
};

// A stage cut from the forward graph: a graph taking (self, inputs...) and returning a tuple of
// the stage's outputs.
class GraphStage : public TorchScriptStage {
 public:
  GraphStage(torch::jit::Module root, std::shared_ptr<torch::jit::GraphFunction> function,
             std::vector<std::string> layers, std::vector<std::string> loose_tensors,
             std::vector<std::string> opened)
      : TorchScriptStage(std::move(root), std::move(layers), std::move(loose_tensors),
                         std::move(opened)),
        function_(std::move(function)) {}

  std::vector<torch::Tensor> ForwardValues(const std::vector<torch::Tensor>& inputs) override {
    torch::jit::Stack stack;
    stack.emplace_back(root_._ivalue());
    for (const torch::Tensor& t : inputs) stack.emplace_back(t);
    std::vector<c10::IValue> out = RunPlain(*function_, std::move(stack));
    std::vector<torch::Tensor> values;
    for (const c10::IValue& v : out.at(0).toTupleRef().elements()) values.push_back(v.toTensor());
    return values;
  }

 private:
  std::shared_ptr<torch::jit::GraphFunction> function_;
};

}  // namespace

absl::Status TorchScriptModel::Impl::Analyse(const std::vector<std::string>& open_toward) {
  torch::jit::Method forward = module.get_method("forward");
  graph = forward.graph()->copy();
  if (graph->inputs().size() != 2 || !IsTensor(graph->inputs()[1])) {
    return absl::InvalidArgumentError(
        absl::StrCat(Prefix(), ": forward must take exactly one tensor, it takes ",
                     graph->inputs().size() - 1, " argument(s)"));
  }
  if (graph->outputs().size() != 1 || !IsTensor(graph->outputs()[0])) {
    return absl::InvalidArgumentError(absl::StrCat(Prefix(),
                                                   ": forward must return one tensor, it returns ",
                                                   graph->outputs()[0]->type()->repr_str()));
  }
  // Self's own helper methods and the opened submodules' calls, inlined.
  OpenNestedCalls(open_toward);
  FindMutation();
  if (mutated.empty()) HoistTensorReads();
  for (Node* n : graph->nodes()) {
    top_index[n] = static_cast<int>(top.size());
    top.push_back(n);
  }
  std::vector<Node*> first_call = FindLayers();
  if (layers.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Prefix(),
                     ": forward calls no submodule, so the model has no layer to cut "
                     "into stages (call the layers as self.<name>(...))"));
  }
  AssignLooseTensors();
  sequential = IsPlainChain(first_call);
  return absl::OkStatus();
}

void TorchScriptModel::Impl::FindMutation() {
  // A forward that assigns module attributes keeps its reads where they are and is not split.
  Value* self = graph->inputs()[0];
  std::vector<Node*> nodes;
  CollectNodes(graph->block(), &nodes);
  for (Node* n : nodes) {
    if (n->kind() == c10::prim::SetAttr && mutated.empty()) {
      mutated = PathFromSelf(n->input(0), self).value_or("?");
      mutated = Join(mutated, n->s(c10::attr::name));
    }
  }
}

void TorchScriptModel::Impl::HoistTensorReads() {
  // One read per tensor attribute, at the top level before its first use.
  Value* self = graph->inputs()[0];
  std::vector<Node*> nodes;
  CollectNodes(graph->block(), &nodes);
  std::map<std::string, Value*> hoisted;
  for (Node* n : nodes) {
    if (n->kind() != c10::prim::GetAttr || !IsTensor(n->output())) continue;
    std::optional<std::string> attr = PathFromSelf(n->output(), self);
    if (!attr) continue;
    auto it = hoisted.find(*attr);
    if (it == hoisted.end()) {
      torch::jit::WithInsertPoint guard(TopLevel(n, graph.get()));
      Value* v = self;
      for (absl::string_view part : absl::StrSplit(*attr, '.')) {
        v = graph->insertGetAttr(v, std::string(part));
      }
      it = hoisted.emplace(*attr, v).first;
    }
    n->output()->replaceAllUsesWith(it->second);
  }
  torch::jit::EliminateDeadCode(graph);
}

std::vector<torchscript_internal::Node*> TorchScriptModel::Impl::FindLayers() {
  // Layers: submodule calls in program order; tensor attribute reads noted on the way.
  Value* self = graph->inputs()[0];
  std::vector<Node*> nodes;
  CollectNodes(graph->block(), &nodes);
  std::vector<Node*> first_call;
  for (Node* n : nodes) {
    if (n->kind() == c10::prim::GetAttr && IsTensor(n->output())) {
      std::optional<std::string> attr = PathFromSelf(n->output(), self);
      if (attr) tensor_reads[n] = *attr;
    }
    if (n->kind() != c10::prim::CallMethod) continue;
    std::optional<std::string> sub = PathFromSelf(n->input(0), self);
    if (!sub || sub->empty()) continue;
    auto [it, added] = layer_index.emplace(*sub, static_cast<int>(layers.size()));
    if (added) {
      ModelLayer layer;
      layer.name = *sub;
      layers.push_back(layer);
      layer_calls.emplace_back();
      first_call.push_back(n);
    }
    layer_calls[it->second].push_back(top_index.at(TopLevel(n, graph.get())));
  }
  return first_call;
}

void TorchScriptModel::Impl::AssignLooseTensors() {
  // Loose tensors: owned by the layer whose part of the graph first reads them; those never
  // read belong to layer 0.
  auto under_a_layer = [&](const std::string& name) {
    for (const ModelLayer& l : layers) {
      if (absl::StartsWith(name, l.name + ".")) return true;
    }
    return false;
  };
  std::set<std::string> loose;
  for (const auto& [name, t] : NamedTensorsOf(module, "", TensorKind::kParameters)) {
    if (!under_a_layer(name)) loose_params.insert(name);
  }
  for (const auto& [name, t] : NamedTensorsOf(module, "", TensorKind::kBuffers)) {
    if (!under_a_layer(name)) loose.insert(name);
  }
  loose.insert(loose_params.begin(), loose_params.end());
  layer_loose_tensors.assign(layers.size(), {});
  std::set<std::string> placed;
  for (Node* n : top) {
    auto it = tensor_reads.find(n);
    if (it == tensor_reads.end() || !loose.count(it->second)) continue;
    int owner = 0;
    for (size_t l = 0; l < layers.size(); ++l) {
      if (layer_calls[l][0] <= top_index.at(n)) owner = static_cast<int>(l);
    }
    layer_loose_tensors[owner].push_back(it->second);
    placed.insert(it->second);
  }
  for (const std::string& name : loose) {
    if (!placed.count(name)) layer_loose_tensors[0].push_back(name);
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    int64_t count = 0;
    for (const auto& p : NamedTensorsOf(module, layers[l].name, TensorKind::kParameters)) {
      count += p.second.numel();
    }
    for (const std::string& name : layer_loose_tensors[l]) {
      if (!loose_params.count(name)) continue;
      auto [owner, attr] = SplitLast(name);
      count += SubmoduleAt(module, owner).attr(attr).toTensor().numel();
    }
    layers[l].parameters = count;
  }
}

bool TorchScriptModel::Impl::IsPlainChain(const std::vector<Node*>& first_call) const {
  // Sequential: top-level nodes are only replicable ones and one call per layer, each taking the
  // previous call's output (the first: the input), the last one's output returned.
  Value* previous = graph->inputs()[1];
  size_t calls = 0;
  for (Node* n : top) {
    if (Replicable(n)) continue;
    if (n->kind() != c10::prim::CallMethod || calls >= layers.size() || n != first_call[calls] ||
        n->s(c10::attr::name) != "forward" || n->inputs().size() != 2 || n->input(1) != previous ||
        n->outputs().size() != 1 || !IsTensor(n->output()) || layer_calls[calls].size() != 1) {
      return false;
    }
    previous = n->output();
    ++calls;
  }
  return calls == layers.size() && graph->outputs()[0] == previous;
}

TorchScriptModel::TorchScriptModel() : impl_(std::make_unique<Impl>()) {}
TorchScriptModel::~TorchScriptModel() = default;

absl::StatusOr<std::unique_ptr<TorchScriptModel>> TorchScriptModel::Load(
    const std::string& path, const std::string& field,
    const std::vector<std::string>& open_toward) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": cannot read '", path, "': no such file"));
  }
  std::unique_ptr<TorchScriptModel> model(new TorchScriptModel());
  Impl& impl = *model->impl_;
  impl.field = field;
  impl.path = path;
  try {
    impl.module = torch::jit::load(path, torch::kCPU);
  } catch (const std::exception& e) {
    return TorchError(
        absl::StrCat(field, ": '", path, "' is not a TorchScript file (torch.jit.save)"), e);
  }
  if (!impl.module.find_method("forward")) {
    return absl::InvalidArgumentError(absl::StrCat(impl.Prefix(), ": the module has no forward"));
  }
  try {
    RETURN_IF_ERROR(impl.Analyse(open_toward));
  } catch (const std::exception& e) {
    return TorchError(absl::StrCat(impl.Prefix(), ": cannot analyse forward"), e);
  }
  return model;
}

const std::vector<ModelLayer>& TorchScriptModel::layers() const { return impl_->layers; }

bool TorchScriptModel::sequential() const { return impl_->sequential; }

std::vector<SplitCandidate> TorchScriptModel::SplitCandidates() { return impl_->Candidates(); }

absl::StatusOr<PipelineWiring> TorchScriptModel::Split(const std::vector<int>& first_layers) {
  Impl& impl = *impl_;
  const int n = static_cast<int>(impl.layers.size());
  if (first_layers.empty() || first_layers[0] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(impl.Prefix(), ": a split's first stage must start at layer 0"));
  }
  for (size_t s = 0; s < first_layers.size(); ++s) {
    if (first_layers[s] >= n || (s > 0 && first_layers[s] <= first_layers[s - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat(impl.Prefix(), ": stage first layers [", absl::StrJoin(first_layers, ", "),
                       "] must increase strictly and stay below the model's ", n, " layers"));
    }
  }
  if (!impl.released.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(impl.Prefix(), ": cannot split again after KeepOnlyStages"));
  }
  if (impl.sequential) {
    impl.first_layers = first_layers;
    impl.wiring = ChainWiring(static_cast<int>(first_layers.size()));
    impl.stage_graphs.clear();
    return impl.wiring;
  }
  try {
    RETURN_IF_ERROR(impl.SplitGraph(first_layers));
  } catch (const std::exception& e) {
    return TorchError(absl::StrCat(impl.Prefix(), ": cannot split the forward graph"), e);
  }
  impl.first_layers = first_layers;
  return impl.wiring;
}

absl::StatusOr<std::unique_ptr<StageModel>> TorchScriptModel::Stage(int stage) {
  Impl& impl = *impl_;
  if (stage < 0 || stage >= static_cast<int>(impl.first_layers.size())) {
    return absl::InvalidArgumentError(absl::StrCat(impl.Prefix(), ": no stage ", stage,
                                                   " in the last split (", impl.first_layers.size(),
                                                   " stages)"));
  }
  if (!impl.released.empty() && impl.released[stage]) {
    return absl::FailedPreconditionError(
        absl::StrCat(impl.Prefix(), ": stage ", stage, "'s parameters were released"));
  }
  std::vector<std::string> names;
  std::vector<std::string> loose;
  std::vector<std::string> opened = {""};
  for (int l = impl.first_layers[stage]; l < impl.LayerEnd(stage); ++l) {
    names.push_back(impl.layers[l].name);
    for (const std::string& t : impl.layer_loose_tensors[l]) loose.push_back(t);
    for (const std::string& m : impl.opened) {
      if (absl::StartsWith(impl.layers[l].name, m + ".") &&
          std::find(opened.begin(), opened.end(), m) == opened.end()) {
        opened.push_back(m);
      }
    }
  }
  if (impl.sequential) {
    return std::unique_ptr<StageModel>(new SequentialStage(impl.module, std::move(names),
                                                           std::move(loose), std::move(opened)));
  }
  auto function = std::make_shared<torch::jit::GraphFunction>(
      c10::QualifiedName(absl::StrCat("stagecoach_stage_", stage)), impl.stage_graphs[stage],
      nullptr);
  return std::unique_ptr<StageModel>(new GraphStage(impl.module, std::move(function),
                                                    std::move(names), std::move(loose),
                                                    std::move(opened)));
}

absl::Status TorchScriptModel::KeepOnlyStages(const std::vector<int>& keep_stages) {
  Impl& impl = *impl_;
  const int stages = static_cast<int>(impl.first_layers.size());
  if (stages == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(impl.Prefix(), ": KeepOnlyStages before Split"));
  }
  std::vector<bool> keep(stages, false);
  for (int s : keep_stages) {
    if (s < 0 || s >= stages) {
      return absl::InvalidArgumentError(
          absl::StrCat(impl.Prefix(), ": no stage ", s, " to keep (", stages, " stages)"));
    }
    keep[s] = true;
  }
  if (impl.released.empty()) impl.released.assign(stages, false);
  // What the kept stages hold; every other parameter and buffer (other layers', and those of
  // submodules that no layer calls) is replaced by an empty tensor.
  std::set<std::string> kept;
  for (int s = 0; s < stages; ++s) {
    if (!keep[s]) {
      impl.released[s] = true;
      continue;
    }
    for (int l = impl.first_layers[s]; l < impl.LayerEnd(s); ++l) {
      for (const auto& t : NamedTensorsOf(impl.module, impl.layers[l].name, TensorKind::kBoth)) {
        kept.insert(t.first);
      }
      for (const std::string& t : impl.layer_loose_tensors[l]) kept.insert(t);
    }
  }
  std::vector<std::pair<std::string, torch::Tensor>> tensors =
      NamedTensorsOf(impl.module, "", TensorKind::kBoth);
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : tensors) {
    if (kept.count(name)) continue;
    auto [owner, attr] = SplitLast(name);
    torch::Tensor empty = torch::empty({0}, tensor.options());
    empty.set_requires_grad(tensor.requires_grad());
    SubmoduleAt(impl.module, owner).setattr(attr, empty);
  }
  return absl::OkStatus();
}

int64_t TorchScriptModel::HeldParameterCount() {
  int64_t n = 0;
  for (const auto& p : impl_->module.named_parameters(/*recurse=*/true)) n += p.value.numel();
  return n;
}

}  // namespace stagecoach::model
