#include "worker/model/stage_model.h"

#include <stdexcept>

namespace stagecoach::model {

std::mutex& SeedMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

PipelineWiring ChainWiring(int num_stages) {
  PipelineWiring out(num_stages);
  for (int s = 0; s < num_stages; ++s) {
    out[s].inputs = {ValueSource{s - 1, 0}};
    out[s].num_outputs = 1;
  }
  return out;
}

bool IsChain(const PipelineWiring& wiring) {
  for (size_t s = 0; s < wiring.size(); ++s) {
    const StageWiring& w = wiring[s];
    if (w.num_outputs != 1 || w.inputs.size() != 1 ||
        !(w.inputs[0] == ValueSource{static_cast<int>(s) - 1, 0})) {
      return false;
    }
  }
  return true;
}

std::vector<ValueConsumer> ConsumersOf(const PipelineWiring& wiring, int stage, int index) {
  std::vector<ValueConsumer> out;
  for (size_t c = 0; c < wiring.size(); ++c) {
    for (size_t i = 0; i < wiring[c].inputs.size(); ++i) {
      if (wiring[c].inputs[i] == ValueSource{stage, index}) {
        out.push_back(ValueConsumer{static_cast<int>(c), static_cast<int>(i)});
      }
    }
  }
  return out;
}

torch::Tensor StageModel::Forward(const torch::Tensor& input) {
  std::vector<torch::Tensor> out = ForwardValues({input});
  if (out.size() != 1) {
    throw std::logic_error("StageModel::Forward on a stage with " + std::to_string(out.size()) +
                           " outputs; use ForwardValues");
  }
  return out[0];
}

}  // namespace stagecoach::model
