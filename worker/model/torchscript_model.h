// A user's TorchScript model (model.torchscript), cut into pipeline stages.
//
// Layers. The model's layers are the submodule calls of its top-level forward, in the order the
// forward graph makes them, named by the submodule's qualified name: "0", "1", ... for an
// nn.Sequential; "embed", "blocks.0", ..., "head" for a module that calls self.embed, then
// loops over an nn.ModuleList self.blocks (TorchScript unrolls the loop), and so on. A layer
// owns its submodule's parameters; parameters the top-level module holds directly belong to the
// first layer that uses them. A submodule called twice (weight sharing) cannot be cut.
//
// Nested layers. A call of a submodule may be opened: replaced by the body of the submodule's
// forward, inlined into the top-level graph, so that the submodules it calls become layers in
// its place ("encoder.layers.encoder_layer_2" instead of "encoder"). A call is opened when
//  - a name given to Load (a split point, or a layer the job was planned with) lies inside the
//    submodule, or
//  - the submodule wraps most of the model around a stack of blocks: it holds more than half of
//    the model's parameters, and it, or a submodule it calls that is opened by this rule, calls
//    two or more distinct submodules of one class that call submodules themselves (a ViT's
//    encoder around its nn.Sequential of encoder blocks) and calls none of them inside an if
//    or a loop, so that a split policy can cut between the blocks;
// but never when its forward assigns module attributes. Opening repeats until no call qualifies.
// An opened module's own tensors, and those of modules no layer calls that the forward reads by
// attribute (`x + self.encoder.pos_embedding`), are loose tensors: each belongs to the first
// layer whose part of the graph reads it (layer 0 when nothing reads it), so it moves, trains
// and is checkpointed with that layer's stage.
//
// Sequential models. When the forward is a plain chain (each layer takes the previous layer's
// output, or the model's input for the first, and the last layer's output is returned, with no
// other computation), a stage is simply its layers' submodules called in turn.
//
// Graph split. Otherwise the top-level forward graph is cut into stage graphs (PyTorch's Pipe
// design): stage s holds the nodes from its first layer's call up to the next stage's first
// layer call (stage 0 also everything before, the last stage everything after). A value that a
// later stage uses is an output of the stage that defines it and an input of each stage that
// uses it, directly (a skip connection does not pass through the stages in between); the
// model's input, when a later stage uses it, is passed on by stage 0. Constants and attribute
// reads of the module are repeated in each stage that uses them. A cut that falls inside
// control flow (a layer called inside an if or a loop that the cut would split) is refused,
// saying which layer and why.
//
// Memory. Each worker loads the file, then keeps only the parameters of its own stages (the
// others are released), so no worker holds the whole model.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/stage_model.h"

namespace stagecoach::model {

struct ModelLayer {
  // Qualified submodule name, e.g. "blocks.3".
  std::string name;
  // Parameter elements the layer owns.
  int64_t parameters = 0;
};

// A module a split point may name.
struct SplitCandidate {
  // Qualified submodule name.
  std::string name;
  // Parameter elements under it (a layer: those it owns, loose ones included).
  int64_t parameters = 0;
  // Opened modules above it.
  int depth = 0;
  // Whether it is a layer (a point at a module holding layers stands for the first or the last
  // of them; a point inside a layer opens the layer when the job is planned).
  bool layer = false;
};

class TorchScriptModel {
 public:
  // Loads a TorchScript file (torch.jit.save) onto the CPU, opening the calls that hold any of
  // `open_toward` (see "Nested layers"). INVALID_ARGUMENT naming `field` and the path when it
  // cannot be read, is not a TorchScript archive, has no forward taking one tensor, or its
  // forward has no layer.
  static absl::StatusOr<std::unique_ptr<TorchScriptModel>> Load(
      const std::string& path, const std::string& field = "model.torchscript",
      const std::vector<std::string>& open_toward = {});

  ~TorchScriptModel();

  // The model's layers, in forward order.
  const std::vector<ModelLayer>& layers() const;
  // Every module a split point may name, in forward order, each opened module before the
  // layers it holds and each layer before the modules its forward calls (at any depth).
  std::vector<SplitCandidate> SplitCandidates();
  // Whether the forward is a plain chain of the layers (see the file comment).
  bool sequential() const;

  // Cuts the model into stages: stage s holds layers [first_layers[s], first_layers[s + 1])
  // (the last up to the end). first_layers[0] must be 0 and the list strictly increasing.
  // Returns every stage's wiring. INVALID_ARGUMENT, naming the layer, when a cut is impossible
  // (inside control flow, a submodule called twice on both sides of a cut, ...).
  absl::StatusOr<PipelineWiring> Split(const std::vector<int>& first_layers);

  // Stage `stage` of the last Split, as a StageModel on the CPU that shares this model's
  // parameters (call To to move it). Valid while this object lives.
  absl::StatusOr<std::unique_ptr<StageModel>> Stage(int stage);

  // Releases the parameters (and buffers) of every layer outside `keep_stages` of the last Split,
  // so that they no longer hold memory. Stage() of a released stage fails afterwards.
  absl::Status KeepOnlyStages(const std::vector<int>& keep_stages);

  // Parameter elements the model still holds (all of them until KeepOnlyStages).
  int64_t HeldParameterCount();

 private:
  TorchScriptModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stagecoach::model
