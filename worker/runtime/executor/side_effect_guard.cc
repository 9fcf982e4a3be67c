#include "worker/runtime/executor/side_effect_guard.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/torch.h>

#include <mutex>

namespace stagecoach::runtime {

torch::Tensor RngState(const torch::Device& device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void SetRngState(const torch::Device& device, const torch::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

SideEffectGuard::SideEffectGuard(model::StageModel& stage, const torch::Device& device)
    : device_(device), rng_state_(RngState(device)) {
  torch::NoGradGuard no_grad;
  for (auto& [name, buffer] : stage.NamedBuffers()) {
    if (buffer.defined()) buffers_.emplace_back(buffer, buffer.clone());
  }
}

SideEffectGuard::~SideEffectGuard() {
  torch::NoGradGuard no_grad;
  // Below the ADInplaceOrView kernel: the copy does not bump the buffers' version counters.
  at::AutoDispatchBelowADInplaceOrView below_version_counting;
  for (auto& [buffer, copy] : buffers_) buffer.copy_(copy);
  SetRngState(device_, rng_state_);
}

}  // namespace stagecoach::runtime
