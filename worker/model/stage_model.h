// One pipeline stage's part of a model: the layers it owns and how to run them forward, and the
// wiring of a pipeline's stages: which values cross from which stage to which.
//
// A stage takes a list of input values and produces a list of output values. In a plain chain
// (built-in models, sequential TorchScript models) every stage has one input, the previous
// stage's only output. A model whose forward is not a chain (a skip connection) is cut into
// stages with several inputs and outputs: a value a later, non-adjacent stage uses goes straight
// from the stage that produces it to the stage that consumes it. The last stage's output 0 is
// the model's output (what the loss takes).
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace stagecoach::model {

// LibTorch's default generator is process-wide: building built-in models from seeds (seeding it,
// then drawing every layer's initial values) holds this lock so that builds do not interleave.
std::mutex& SeedMutex();

// Where one input of a stage comes from: output `index` of stage `stage`. Stage -1 is the
// pipeline's input (the microbatch of the batch's inputs); only stage 0 reads it.
struct ValueSource {
  int stage = -1;
  int index = 0;
  friend bool operator==(const ValueSource& a, const ValueSource& b) {
    return a.stage == b.stage && a.index == b.index;
  }
};

// The values one stage takes and produces.
struct StageWiring {
  // inputs[i]: where the stage's input i comes from; every source is an earlier stage (or -1
  // for stage 0).
  std::vector<ValueSource> inputs;
  // Number of outputs; each is consumed by at least one later stage (the last stage: exactly
  // one output, the model's output).
  int num_outputs = 1;
};

// The wiring of every stage of a pipeline, indexed by stage.
using PipelineWiring = std::vector<StageWiring>;

// A chain: stage 0 takes the pipeline's input, stage s > 0 takes stage s-1's output 0, every
// stage has one output.
PipelineWiring ChainWiring(int num_stages);

// Whether `wiring` is a chain (ChainWiring of its size).
bool IsChain(const PipelineWiring& wiring);

// A consumer of one output value: input `input` of stage `stage`.
struct ValueConsumer {
  int stage = 0;
  int input = 0;
};

// Who consumes output `index` of stage `stage`, in (stage, input) order.
std::vector<ValueConsumer> ConsumersOf(const PipelineWiring& wiring, int stage, int index);

// A stage's layers. Not thread-safe; a stage is run by one thread at a time.
class StageModel {
 public:
  virtual ~StageModel() = default;

  // Runs the stage on one microbatch: `inputs` in the order of the stage's wiring inputs; returns
  // its outputs in order. Autograd records the graph when grad mode is on.
  virtual std::vector<torch::Tensor> ForwardValues(const std::vector<torch::Tensor>& inputs) = 0;

  // The stage's parameters with their names in the whole model (e.g. "3.weight"), in a
  // stable order.
  virtual std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() = 0;

  // The stage's buffers (state that is not a parameter: a BatchNorm's running_mean, running_var
  // and num_batches_tracked, any tensor a user's module registers with register_buffer) with
  // their names in the whole model, in a stable order. They are part of the stage's state:
  // checkpointed, exported and restored with the parameters, and left untouched by the
  // executor's shape probes. The built-in families have none.
  virtual std::vector<std::pair<std::string, torch::Tensor>> NamedBuffers() { return {}; }

  // Moves the stage's parameters and buffers to `device`; call before handing them to an
  // optimizer.
  virtual void To(const torch::Device& device) = 0;

  // Puts the stage's layers in training (true) or evaluation mode (false), for layers whose
  // forward differs between them (dropout, batch norm): a validation pass runs in evaluation
  // mode. The built-in families have no such layers; TorchScript stages set their submodules'
  // `training` flags (Module::train).
  virtual void SetTraining(bool training) { (void)training; }

  // The documents of the rows of the forwards that follow (data.packing: pack): `segments` int64
  // [B, T] gives each position's document within its row (-1 on padding); each document then
  // attends within itself only, its positions counted from 0. Undefined: each row is one
  // sequence. Returns false for a stage that cannot keep documents apart (only the built-in
  // decoders can); it then ignores them.
  virtual bool SetSegments(const torch::Tensor& segments) { return !segments.defined(); }

  // A stage of a chain: one input, one output.
  torch::Tensor Forward(const torch::Tensor& input);

  std::vector<torch::Tensor> Parameters() {
    std::vector<torch::Tensor> out;
    for (auto& [name, p] : NamedParameters()) out.push_back(p);
    return out;
  }

  // Parameter elements the stage holds.
  int64_t ParameterCount() {
    int64_t n = 0;
    for (auto& [name, p] : NamedParameters()) n += p.numel();
    return n;
  }
};

}  // namespace stagecoach::model
