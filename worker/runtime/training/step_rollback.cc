#include "worker/runtime/training/step_rollback.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/torch.h>

#include "worker/runtime/executor/side_effect_guard.h"

namespace stagecoach::runtime {

StepRollback::StepRollback(std::map<int, model::StageModel*> stages, torch::Device device)
    : stages_(std::move(stages)), device_(device) {}

std::vector<torch::Tensor> StepRollback::Buffers() const {
  std::vector<torch::Tensor> out;
  for (const auto& [index, stage] : stages_) {
    for (auto& [name, buffer] : stage->NamedBuffers()) {
      if (buffer.defined()) out.push_back(buffer);
    }
  }
  return out;
}

void StepRollback::CopyInto(const std::vector<torch::Tensor>& to,
                            const std::vector<torch::Tensor>& from) {
  torch::NoGradGuard no_grad;
  at::AutoDispatchBelowADInplaceOrView below_version_counting;
  for (size_t i = 0; i < to.size() && i < from.size(); ++i) to[i].copy_(from[i]);
}

void StepRollback::Take() {
  torch::NoGradGuard no_grad;
  start_.clear();
  for (const torch::Tensor& b : Buffers()) start_.push_back(b.clone());
  rng_state_ = RngState(device_);
}

void StepRollback::Restore() {
  CopyInto(Buffers(), start_);
  if (rng_state_.defined()) SetRngState(device_, rng_state_);
}

void StepRollback::KeepBuffers() {
  torch::NoGradGuard no_grad;
  kept_.clear();
  for (const torch::Tensor& b : Buffers()) kept_.push_back(b.clone());
}

void StepRollback::PutBackKept() { CopyInto(Buffers(), kept_); }

}  // namespace stagecoach::runtime
