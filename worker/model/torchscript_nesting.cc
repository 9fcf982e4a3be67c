// TorchScriptModel::Impl::OpenNestedCalls: inlines the top-level module's own helper methods and
// the calls of opened submodules into the top-level forward graph, so that the submodules those
// call become layers (torchscript_model.h, "Nested layers"); Impl::Candidates: every module a
// split point may name.
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/model/torchscript_internal.h"

namespace stagecoach::model {

using torchscript_internal::CollectNodes;
using torchscript_internal::Join;
using torchscript_internal::PathFromSelf;
using torchscript_internal::SubmoduleAt;

namespace {

// A method's own graph, not its optimised one (which has its submodule calls inlined).
torch::jit::GraphFunction& OwnGraphFunction(const torch::jit::Module& m, const std::string& name) {
  return torch::jit::toGraphFunction(m.get_method(name).function());
}

// The class of a module without TorchScript's mangling ("__torch__.___torch_mangle_3.Block" and
// "__torch__.Block" are one class written twice).
std::string ClassName(const torch::jit::Module& m) {
  std::string name = m.type()->name()->qualifiedName();
  std::string out;
  for (absl::string_view part : absl::StrSplit(name, '.')) {
    if (absl::StartsWith(part, "___torch_mangle_")) continue;
    absl::StrAppend(&out, out.empty() ? "" : ".", part);
  }
  return out;
}

// Whether the module's forward calls a submodule inside an if or a loop: opened, such a call
// could not be cut from its neighbours, so a split policy gains nothing by opening it.
bool CallsInsideControlFlow(const torch::jit::Module& m) {
  std::shared_ptr<torch::jit::Graph> g = OwnGraphFunction(m, "forward").graph();
  std::vector<torch::jit::Node*> nodes;
  CollectNodes(g->block(), &nodes);
  for (torch::jit::Node* n : nodes) {
    if (n->kind() == c10::prim::CallMethod && n->owningBlock() != g->block()) return true;
  }
  return false;
}

int64_t ParameterCount(const torch::jit::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.named_parameters(/*recurse=*/true)) n += p.value.numel();
  return n;
}

}  // namespace

std::vector<std::string> TorchScriptModel::Impl::CalledSubmodules(const std::string& path) {
  auto cached = called.find(path);
  if (cached != called.end()) return cached->second;
  torch::jit::Module m = SubmoduleAt(module, path);
  std::vector<std::string> out;
  std::set<std::string> seen_methods;
  std::function<void(const std::string&)> walk = [&](const std::string& method) {
    if (!seen_methods.insert(method).second || !m.find_method(method)) return;
    std::shared_ptr<Graph> g = OwnGraphFunction(m, method).graph();
    Value* self = g->inputs()[0];
    std::vector<Node*> nodes;
    CollectNodes(g->block(), &nodes);
    for (Node* n : nodes) {
      if (n->kind() != c10::prim::CallMethod) continue;
      std::optional<std::string> sub = PathFromSelf(n->input(0), self);
      if (!sub) continue;
      if (sub->empty()) {
        walk(n->s(c10::attr::name));  // a helper method of the module itself
      } else if (std::find(out.begin(), out.end(), Join(path, *sub)) == out.end()) {
        out.push_back(Join(path, *sub));
      }
    }
  };
  walk("forward");
  called[path] = out;
  return out;
}

bool TorchScriptModel::Impl::WrapsDominantStack(const std::string& path) {
  auto cached = dominant.find(path);
  if (cached != dominant.end()) return cached->second;
  bool result = false;
  const std::vector<std::string> calls = CalledSubmodules(path);
  if (!calls.empty() && 2 * ParameterCount(SubmoduleAt(module, path)) > total_parameters &&
      !CallsInsideControlFlow(SubmoduleAt(module, path))) {
    // A stack: two distinct called submodules of one class that call submodules themselves.
    std::map<std::string, int> blocks;
    for (const std::string& c : calls) {
      if (!CalledSubmodules(c).empty() && ++blocks[ClassName(SubmoduleAt(module, c))] >= 2) {
        result = true;
      }
    }
    for (const std::string& c : calls) result = result || WrapsDominantStack(c);
  }
  dominant[path] = result;
  return result;
}

bool TorchScriptModel::Impl::ShouldOpen(const std::string& path,
                                        const std::vector<std::string>& toward) {
  if (opened.count(path)) return true;
  bool open = WrapsDominantStack(path);
  for (const std::string& t : toward) open = open || absl::StartsWith(t, path + ".");
  if (!open) return false;
  // A module whose forward assigns its attributes keeps its call: inlined, the assignment would
  // stop the whole forward from being cut.
  std::vector<Node*> nodes;
  CollectNodes(OwnGraphFunction(SubmoduleAt(module, path), "forward").graph()->block(), &nodes);
  for (Node* n : nodes) {
    if (n->kind() == c10::prim::SetAttr) return false;
  }
  return true;
}

void TorchScriptModel::Impl::OpenNestedCalls(const std::vector<std::string>& toward) {
  total_parameters = ParameterCount(module);
  Value* self = graph->inputs()[0];
  for (bool changed = true; changed;) {
    changed = false;
    std::vector<Node*> nodes;
    CollectNodes(graph->block(), &nodes);
    for (Node* n : nodes) {
      if (n->kind() != c10::prim::CallMethod) continue;
      std::optional<std::string> sub = PathFromSelf(n->input(0), self);
      if (!sub || (!sub->empty() && !ShouldOpen(*sub, toward))) continue;
      if (!sub->empty()) opened.insert(*sub);
      torch::jit::GraphFunction& callee =
          OwnGraphFunction(SubmoduleAt(module, *sub), n->s(c10::attr::name));
      torch::jit::inlineCallTo(n, &callee, callee.graph().get());
      changed = true;
      break;
    }
  }
}

std::vector<SplitCandidate> TorchScriptModel::Impl::Candidates() {
  std::vector<SplitCandidate> out;
  std::set<std::string> listed;
  // A layer counts what it owns (its module's tensors and the loose ones it reads).
  std::function<void(const std::string&, int, const ModelLayer*)> add =
      [&](const std::string& path, int depth, const ModelLayer* layer) {
    if (!listed.insert(path).second) return;
    SplitCandidate c;
    c.name = path;
    c.parameters = layer ? layer->parameters : ParameterCount(SubmoduleAt(module, path));
    c.depth = depth;
    c.layer = layer != nullptr;
    out.push_back(c);
    for (const std::string& sub : CalledSubmodules(path)) add(sub, depth + 1, nullptr);
  };
  // Opened modules come before the layers they hold: each is listed where its first layer is.
  for (const ModelLayer& layer : layers) {
    std::vector<std::string> parts = absl::StrSplit(layer.name, '.');
    std::string prefix;
    int depth = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      prefix = Join(prefix, parts[i]);
      if (opened.count(prefix) && !listed.count(prefix)) {
        SplitCandidate c;
        c.name = prefix;
        c.parameters = ParameterCount(SubmoduleAt(module, prefix));
        c.depth = depth;
        out.push_back(c);
        listed.insert(prefix);
      }
      if (opened.count(prefix)) ++depth;
    }
    add(layer.name, depth, &layer);
  }
  return out;
}

}  // namespace stagecoach::model
