// A healed replica's state from a live one (docs/recovery.md): every member of the
// data-parallel group of the epoch that takes the healed replica back in calls SyncReplicaState
// before the step it joins at, with the same donor. For each of the rank's stages, in order, the
// donor sends its training state (parameters, buffers and optimizer state, as the bytes of a
// checkpoint's training-state file: checkpoint.h) and every other member installs it
// (RestoreSavedState: the same checks as a resume, naming the stage); then the donor's random
// generator state, so that dropout draws the same on every replica. The healthy members install
// the bits they already hold; the group is the data plane, not the disk.
//
// Over Collectives::Broadcast from the donor: a length, then the bytes (padded to whole float32
// elements; the broadcast copies bytes, it computes nothing). Not thread-safe: the task's
// thread, between steps.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/collectives/collectives.h"
#include "worker/model/stage_model.h"

namespace stagecoach::runtime {

struct SyncStats {
  int64_t bytes = 0;  // state bytes the donor sent per member
  absl::Duration took;
};

// See the file comment. `donor` is the group rank that sends; `global_step` the step the state
// is after (the join step). The group's errors (naming the stage); the install's.
absl::StatusOr<SyncStats> SyncReplicaState(collectives::Collectives& group, int donor,
                                           const std::map<int, model::StageModel*>& stages,
                                           torch::optim::Optimizer& optimizer,
                                           const torch::Device& device, int64_t global_step,
                                           absl::Duration timeout);

}  // namespace stagecoach::runtime
