// A run of a stage that leaves no trace: what the stage's forward changes besides its outputs
// (its buffers, such as a BatchNorm's running statistics and num_batches_tracked, and the
// device's default random generator) is put back when the guard goes out of scope.
//
// The executor runs a stage without it being a step's forward twice: the shape probes before the
// first step (PipelineExecutor::OutputMetas, on zeros) and recomputation (the forward rerun before
// its backward). Without the guard the first would update every BatchNorm's running statistics
// from zeros and the second would update them twice per microbatch, so evaluation would no
// longer equal plain PyTorch's after the same training.
//
// Buffers are restored in place and below autograd's version counting: a BatchNorm's backward
// saves its running statistics, and a version bump between forward and backward would make the
// recomputed graph's backward fail.
//
// Thread safety: one guard per stage run, on the thread that runs the stage.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "worker/model/stage_model.h"

namespace stagecoach::runtime {

class SideEffectGuard {
 public:
  // Snapshots `stage`'s buffers and the state of `device`'s default generator. `stage` must
  // outlive the guard.
  SideEffectGuard(model::StageModel& stage, const torch::Device& device);
  // Restores them.
  ~SideEffectGuard();

  SideEffectGuard(const SideEffectGuard&) = delete;
  SideEffectGuard& operator=(const SideEffectGuard&) = delete;

 private:
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers_;  // live buffer, its copy
  torch::Device device_;
  torch::Tensor rng_state_;
};

// The state of `device`'s default random generator, and setting it.
torch::Tensor RngState(const torch::Device& device);
void SetRngState(const torch::Device& device, const torch::Tensor& state);

}  // namespace stagecoach::runtime
