// TorchScriptModel::Impl::SplitGraph: cuts a model's forward graph into stage graphs at the
// first layers of the stages (see torchscript_model.h), with the wiring of the values that cross
// from stage to stage.
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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/util/status_macros.h"
#include "worker/model/torchscript_internal.h"

namespace stagecoach::model {

using torchscript_internal::CollectNodes;
using torchscript_internal::IsTensor;
using torchscript_internal::Recomputable;
using torchscript_internal::Replicable;
using torchscript_internal::TopLevel;

absl::Status TorchScriptModel::Impl::SplitGraph(const std::vector<int>& cuts) {
  if (!mutated.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Prefix(), ": cannot cut the forward into stages: it assigns attribute '",
                     mutated, "', and each stage holds only its own part of the module"));
  }
  const int stages = static_cast<int>(cuts.size());
  Value* self = graph->inputs()[0];
  Value* input = graph->inputs()[1];

  // Stage boundaries in top-level node indices.
  std::vector<int> bound(stages + 1, static_cast<int>(top.size()));
  bound[0] = 0;
  for (int s = 1; s < stages; ++s) {
    const int layer = cuts[s];
    const int at = layer_calls[layer][0];
    const std::string& name = layers[layer].name;
    Node* holder = top[at];
    if (!holder->blocks().empty()) {
      for (int l = 0; l < layer; ++l) {
        for (int c : layer_calls[l]) {
          if (c == at) {
            return absl::InvalidArgumentError(
                absl::StrCat(Prefix(), ": cannot cut before layer '", name,
                             "': it is called inside control flow (", holder->kind().toQualString(),
                             ") together with layer '", layers[l].name,
                             "', which the cut would separate from it"));
          }
        }
      }
    }
    for (int l = 0; l < layer; ++l) {
      for (int c : layer_calls[l]) {
        if (c >= at) {
          return absl::InvalidArgumentError(absl::StrCat(
              Prefix(), ": cannot cut before layer '", name, "': layer '", layers[l].name,
              "' is called both before and after the cut (a submodule called twice cannot be "
              "split across stages)"));
        }
      }
    }
    bound[s] = at;
  }

  // Each top-level node's stage; tensor attribute reads go to the stage of the layer owning them.
  std::unordered_map<Node*, int> stage_of;
  auto layer_stage = [&](int layer) {
    int s = 0;
    while (s + 1 < stages && cuts[s + 1] <= layer) ++s;
    return s;
  };
  for (int s = 0; s < stages; ++s) {
    for (int i = bound[s]; i < bound[s + 1]; ++i) stage_of[top[i]] = s;
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    for (const std::string& name : layer_loose_tensors[l]) {
      for (auto& [n, attr] : tensor_reads) {
        if (attr == name) stage_of[n] = layer_stage(static_cast<int>(l));
      }
    }
  }
  for (auto& [n, attr] : tensor_reads) {
    // A read of a submodule's tensor: the stage of the layer holding it.
    for (size_t l = 0; l < layers.size(); ++l) {
      if (attr.rfind(layers[l].name + ".", 0) == 0) stage_of[n] = layer_stage(static_cast<int>(l));
    }
    for (Value* v : n->outputs()) {
      for (const torch::jit::Use& use : v->uses()) {
        Node* user = TopLevel(use.user, graph.get());
        if (user->kind() == c10::prim::Return) continue;
        if (stage_of.at(user) < stage_of.at(n)) {
          return absl::InvalidArgumentError(
              absl::StrCat(Prefix(), ": cannot cut this way: '", attr, "' belongs to stage ",
                           stage_of.at(n), " but stage ", stage_of.at(user), " uses it first"));
        }
      }
    }
  }

  // Every stage's nodes, in order.
  std::vector<std::vector<Node*>> stage_nodes(stages);
  for (Node* n : top) {
    if (!Replicable(n)) stage_nodes[stage_of.at(n)].push_back(n);
  }

  // Values each stage receives from earlier stages. Ordinal: definition order (input first).
  auto ordinal = [&](Value* v) -> std::pair<int, size_t> {
    if (v == input) return {-1, 0};
    return {top_index.at(v->node()), v->offset()};
  };
  auto producer = [&](Value* v) { return v == input ? 0 : stage_of.at(v->node()); };
  std::vector<std::set<std::pair<std::pair<int, size_t>, Value*>>> needs(stages);
  // Resolves value `v` used in stage `t`: what must cross into `t` for it.
  std::function<absl::Status(Value*, int)> resolve = [&](Value* v, int t) -> absl::Status {
    if (v == self) return absl::OkStatus();
    if (v == input) {
      if (t > 0) needs[t].insert({ordinal(v), v});
      return absl::OkStatus();
    }
    Node* n = v->node();
    if (Replicable(n)) {
      for (Value* in : n->inputs()) RETURN_IF_ERROR(resolve(in, t));
      return absl::OkStatus();
    }
    const int s = stage_of.at(n);
    if (s == t) return absl::OkStatus();
    if (s > t) {
      return absl::InternalError(
          absl::StrCat(Prefix(), ": stage ", t, " uses a value of stage ", s));
    }
    if (IsTensor(v)) {
      needs[t].insert({ordinal(v), v});
      return absl::OkStatus();
    }
    if (!Recomputable(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Prefix(), ": cannot cut before layer '", layers[cuts[t]].name, "': value %",
                       v->debugName(), " (", v->type()->repr_str(), ") made by ",
                       n->kind().toQualString(), " in stage ", s, " is used by stage ", t,
                       "; only tensors can pass between stages, and it cannot be recomputed"));
    }
    for (Value* in : n->inputs()) RETURN_IF_ERROR(resolve(in, t));
    return absl::OkStatus();
  };
  // Values used by node `n` (nested blocks included) that are defined outside it.
  auto external_inputs = [](Node* n) {
    std::vector<Value*> out;
    std::vector<Node*> inner{n};
    for (torch::jit::Block* b : n->blocks()) CollectNodes(b, &inner);
    std::unordered_set<Value*> defined;
    for (Node* m : inner) {
      for (Value* o : m->outputs()) defined.insert(o);
      for (torch::jit::Block* b : m->blocks()) {
        for (Value* p : b->inputs()) defined.insert(p);
      }
    }
    for (Node* m : inner) {
      for (Value* i : m->inputs()) {
        if (!defined.count(i)) out.push_back(i);
      }
      for (torch::jit::Block* b : m->blocks()) {
        for (Value* r : b->outputs()) {
          if (!defined.count(r)) out.push_back(r);
        }
      }
    }
    return out;
  };
  for (int t = 0; t < stages; ++t) {
    for (Node* n : stage_nodes[t]) {
      for (Value* v : external_inputs(n)) RETURN_IF_ERROR(resolve(v, t));
    }
  }
  RETURN_IF_ERROR(resolve(graph->outputs()[0], stages - 1));

  // Outputs: every value a later stage needs, in definition order; the last stage returns the
  // model's output.
  std::vector<std::vector<Value*>> outputs(stages);
  std::map<Value*, int> output_index;
  {
    std::set<std::pair<std::pair<int, size_t>, Value*>> crossing;
    for (int t = 0; t < stages; ++t) crossing.insert(needs[t].begin(), needs[t].end());
    for (const auto& [ord, v] : crossing) {
      const int s = producer(v);
      output_index[v] = static_cast<int>(outputs[s].size());
      outputs[s].push_back(v);
    }
  }
  outputs[stages - 1] = {graph->outputs()[0]};

  PipelineWiring result(stages);
  std::vector<std::shared_ptr<Graph>> graphs(stages);
  for (int t = 0; t < stages; ++t) {
    std::vector<Value*> ins;
    if (t == 0) {
      ins.push_back(input);
      result[0].inputs.push_back(ValueSource{-1, 0});
    } else {
      std::vector<std::pair<ValueSource, Value*>> sources;
      for (const auto& [ord, v] : needs[t]) {
        sources.push_back({ValueSource{producer(v), output_index.at(v)}, v});
      }
      std::sort(sources.begin(), sources.end(), [](const auto& a, const auto& b) {
        return std::make_pair(a.first.stage, a.first.index) <
               std::make_pair(b.first.stage, b.first.index);
      });
      for (const auto& [source, v] : sources) {
        result[t].inputs.push_back(source);
        ins.push_back(v);
      }
    }
    result[t].num_outputs = static_cast<int>(outputs[t].size());

    auto g = std::make_shared<Graph>();
    std::unordered_map<Value*, Value*> env;
    env[self] = g->addInput("self")->setType(self->type());
    for (Value* v : ins) env[v] = g->addInput()->setType(v->type())->copyMetadata(v);
    // Clones the nodes a value of another stage (replicable or recomputable) needs.
    std::function<Value*(Value*)> get = [&](Value* v) -> Value* {
      auto it = env.find(v);
      if (it != env.end()) return it->second;
      Node* n = v->node();
      for (Value* in : n->inputs()) get(in);
      Node* clone = g->insertNode(g->createClone(n, [&](Value* in) { return env.at(in); }));
      for (size_t i = 0; i < n->outputs().size(); ++i) env[n->output(i)] = clone->output(i);
      return env.at(v);
    };
    for (Node* n : stage_nodes[t]) {
      for (Value* v : external_inputs(n)) get(v);
      Node* clone = g->insertNode(g->createClone(n, [&](Value* in) { return env.at(in); }));
      for (size_t i = 0; i < n->outputs().size(); ++i) env[n->output(i)] = clone->output(i);
    }
    std::vector<Value*> outs;
    for (Value* v : outputs[t]) outs.push_back(get(v));
    g->registerOutput(g->insertNode(g->createTuple(outs))->output());
    try {
      g->lint();
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat(Prefix(), ": stage ", t, "'s graph is malformed: ", e.what()));
    }
    graphs[t] = std::move(g);
  }
  wiring = std::move(result);
  stage_graphs = std::move(graphs);
  return absl::OkStatus();
}

}  // namespace stagecoach::model
