// What the built-in decoders (gpt.h, llama.h) share: a stage that is a chain of named layers,
// each a module whose named_parameters() are the paths inside it, and an output head whose
// weight may be the token embedding's (tied). Not thread-safe, as StageModel.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/model/kv_cache.h"
#include "worker/model/stage_model.h"

namespace stagecoach::model {

// One layer of a chain: [B, T, ...] -> [B, T, ...].
class ChainLayer : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  // The layer on the new positions `at` of a decoding session ([n, T, ...] for at's n rows),
  // with `kv` its cache; without one (packed rows, DecodePositions::Packed), on x's positions
  // alone at at.positions under at.hidden. A layer that mixes positions (attention) or knows
  // them (learned positions, rotary embeddings) overrides it; the others act on each position
  // alone.
  virtual torch::Tensor ForwardCached(const torch::Tensor& x, const DecodePositions& at,
                                      LayerKv* kv) {
    (void)at;
    (void)kv;
    return forward(x);
  }
};

// Linear(hidden, vocab) without bias ("weight" [vocab, hidden]).
class OutputHead : public ChainLayer {
 public:
  // Its own weight, drawn normal(0, init_std).
  OutputHead(int64_t hidden, int64_t vocab, double init_std);
  // Tied, in the embedding's stage: the embedding's tensor itself, not a parameter of the head
  // (the stage lists it once, under the embedding's name).
  static std::shared_ptr<OutputHead> Sharing(const torch::Tensor& embedding);
  // Tied, on another stage: a copy of the embedding's initial values as its own "weight"
  // (worker/runtime/training/tied_parameters.h keeps the copies equal).
  static std::shared_ptr<OutputHead> Copying(const torch::Tensor& embedding);

  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  OutputHead(torch::Tensor weight, bool own);
  torch::Tensor weight_;
};

// A stage of named layers run in order; parameter names are "<layer>.<path>".
class LayerChainStage : public StageModel {
 public:
  using Layers = std::vector<std::pair<std::string, std::shared_ptr<ChainLayer>>>;
  explicit LayerChainStage(Layers layers) : layers_(std::move(layers)) {}

  // With segments set (SetSegments), each row's documents apart (DecodePositions::Packed).
  std::vector<torch::Tensor> ForwardValues(const std::vector<torch::Tensor>& inputs) override;
  bool SetSegments(const torch::Tensor& segments) override;
  // The stage on a decoding session's new positions `at` (kv_cache.h), each layer with its
  // cache in `kv`; equals ForwardValues on the rows' whole contexts at those positions.
  torch::Tensor ForwardCached(const torch::Tensor& x, const DecodePositions& at, StageKv& kv);
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() override;
  void To(const torch::Device& device) override;

 private:
  Layers layers_;
  torch::Tensor segments_;
};

}  // namespace stagecoach::model
