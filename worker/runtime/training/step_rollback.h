// What a step changes besides gradients and the optimizer's state, kept so that the step can
// be undone or run again on other microbatches: each of the rank's stages' buffers (a
// BatchNorm's running statistics) and the device's default random generator.
//
// Replicas that carry on (docs/recovery.md) use it twice. A step abandoned before its optimizer
// step (SettleStep answered RETRY) is put back to its start (Restore). A replica that runs more
// than one slice of the global batch runs each pass from the step's start (Restore before every
// pass after the first), as the replica that owned the slice would have, and ends the step
// with the buffers of its first pass (KeepBuffers after it, PutBackKept after the last): the
// lowest slice's, which are the ones every replica takes after the step (replica_buffers.h).
// The generator ends where one pass leaves it, as on every replica of a whole job.
//
// Buffers are copied in place below autograd's version counting (side_effect_guard.h).
// Not thread-safe: the task's thread, between the executor's steps.
#pragma once

#include <torch/types.h>

#include <map>
#include <utility>
#include <vector>

#include "worker/model/stage_model.h"

namespace stagecoach::runtime {

class StepRollback {
 public:
  // `stages` must outlive it.
  StepRollback(std::map<int, model::StageModel*> stages, torch::Device device);

  // Takes the step's start: the buffers and the generator's state.
  void Take();
  // Puts the step's start back.
  void Restore();
  // Remembers the buffers as they are now / puts them back.
  void KeepBuffers();
  void PutBackKept();

 private:
  // Every defined buffer of the stages, in order.
  std::vector<torch::Tensor> Buffers() const;
  static void CopyInto(const std::vector<torch::Tensor>& to,
                       const std::vector<torch::Tensor>& from);

  const std::map<int, model::StageModel*> stages_;
  const torch::Device device_;
  std::vector<torch::Tensor> start_;
  std::vector<torch::Tensor> kept_;
  torch::Tensor rng_state_;
};

}  // namespace stagecoach::runtime
