// A rank's stages restored from a checkpoint written on another layout (ResumeTask.by_name: the
// coordinator lists the files of every checkpoint stage that holds a layer of the rank's stages,
// coordinator/checkpoints/resume_layout.h): each parameter, buffer and optimizer state by the
// parameter's name (worker/runtime/checkpoint/checkpoint_by_name.h), into per-parameter state
// or this replica's ZeRO-1 shard (zero_shards.h), whatever the checkpoint's stage count,
// schedule, replica count or shard level. A tied copy (tied_parameters.h) the checkpoint holds
// once comes from its first stage's name.
#pragma once

#include <torch/optim/optimizer.h>

#include <map>
#include <optional>

#include "absl/status/status.h"
#include "stagecoach/v1/types.pb.h"
#include "worker/model/stage_model.h"
#include "worker/runtime/checkpoint/state_file.h"
#include "worker/runtime/sharding/zero_shards.h"
#include "worker/runtime/training/tied_parameters.h"

namespace stagecoach::runtime {

// Restores every stage of `stages` from `resume`'s files in `files` (its step directory, or an
// in-memory snapshot's files) by name: values and buffers always; with
// `optimizer` (null for forward-only tasks) the optimizer state, into `shards` when not null.
// Checks everything a stage needs before changing that stage; errors name the stage and the
// parameter or buffer the checkpoint lacks or whose shape differs
// (CheckpointByName::StateFor, RestoreSavedState), or the file that does not verify.
absl::Status RestoreStagesByName(const v1::ResumeTask& resume, const StateFiles& files,
                                 const std::map<int, model::StageModel*>& stages,
                                 const std::optional<TiedPair>& tied,
                                 torch::optim::Optimizer* optimizer, ZeroShards* shards);

}  // namespace stagecoach::runtime
