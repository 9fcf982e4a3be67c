// The rule for buffers under data parallelism (placement.replicas): after every step, each stage's
// buffers (a BatchNorm's running statistics and count; StageModel::NamedBuffers) are replica 0's
// on every replica. Replica 0's are broadcast through the rank's data-parallel group, as
// PyTorch's DistributedDataParallel does by default (broadcast_buffers=True, from rank 0 before
// each forward). So replicas never drift apart, an eval pass sees one model on every replica, and
// a checkpoint (written by replica 0) holds what every replica has.
//
// Each buffer is one collective call, in the stages' and the buffers' order, which every replica
// shares (they run the same model). Floating-point buffers travel as they are (float32, float64;
// other floating types as float32); integer and boolean buffers as float64, which holds them
// exactly up to 2^53. A stage without buffers costs nothing (no call at all).
//
// Thread safety: call on the task's thread between steps, while no other collective of the group
// is in flight.
#pragma once

#include <map>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/collectives/collectives.h"
#include "worker/model/stage_model.h"

namespace stagecoach::runtime {

// Copies group rank 0's buffers of every stage of `stages` into every rank's. The group's
// errors, naming the stage and the buffer (the caller aborts the group); INVALID_ARGUMENT for a
// buffer of a type that cannot travel (complex).
absl::Status BroadcastReplicaBuffers(collectives::Collectives& group,
                                     const std::map<int, model::StageModel*>& stages,
                                     absl::Duration timeout);

}  // namespace stagecoach::runtime
