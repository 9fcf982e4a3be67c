// A user's TorchScript model (model.torchscript), cut into pipeline stages.
//
// Layers. The model's layers are the submodule calls of its top-level forward, in the order the
// forward graph makes them, named by the submodule's qualified name: "0", "1", ... for an
// nn.Sequential; "embed", "blocks.0", ..., "head" for a module that calls self.embed, then
// loops over an nn.ModuleList self.blocks (TorchScript unrolls the loop), and so on. A layer
// owns its submodule's parameters; parameters the top-level module holds directly belong to the
// first layer that uses them. A submodule called twice (weight sharing) cannot be cut.
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

class TorchScriptModel {
 public:
  // Loads a TorchScript file (torch.jit.save) onto the CPU. INVALID_ARGUMENT naming `field` and
  // the path when it cannot be read, is not a TorchScript archive, has no forward taking one
  // tensor, or its forward has no layer.
  static absl::StatusOr<std::unique_ptr<TorchScriptModel>> Load(
      const std::string& path, const std::string& field = "model.torchscript");

  ~TorchScriptModel();

  // The model's layers, in forward order.
  const std::vector<ModelLayer>& layers() const;
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
