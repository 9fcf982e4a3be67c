// Stage checkpoint files: what a worker writes into training.checkpoint.dir, and how a task
// resumes from them (training.resume_from).
//
// Layout (common/checkpoint/layout.h, docs/checkpoints.md): <dir>/step-<NNNNNN>/ (six digits or
// more: the global step, i.e. the steps of the job's timeline the checkpoint holds) contains, per
// stage s,
//   stage-<s>.pt             the stage's full training state: one pickled dict (torch.save format,
//                            written by torch::pickle_save) with keys
//                              "state_dict"    {parameter name -> tensor}, original names
//                                              ("3.weight", "blocks.0.attn.qkv.weight")
//                              "buffers"       {buffer name -> tensor}, original names
//                                              ("1.running_mean"); absent in files written
//                                              before buffers were kept
//                              "optimizer"     {"<param>.<field>" -> tensor}: AdamW "exp_avg",
//                                              "exp_avg_sq", "step" (int64 scalar) and, with
//                                              amsgrad, "max_exp_avg_sq"; SGD "momentum_buffer".
//                                              A parameter without state (no step taken yet, SGD
//                                              without momentum) has no entry.
//                              "stage", "step", "data_position"   ints
//   stage-<s>.state_dict.pt  the export: {name -> tensor} of the stage's parameters and buffers,
//                            loadable with torch.load; every stage's merged load into the
//                            user's module with load_state_dict(..., strict=True)
// and, written last by the coordinator, manifest.json
// (coordinator/checkpoints/checkpoint_manifest.h). Every file is written durably
// (common/util/durable_file.h: a temporary name, flushed, then linked into place), so a reader
// never sees a half-written file and an existing file is never replaced.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/checkpoint/layout.h"
#include "stagecoach/v1/types.pb.h"
#include "worker/runtime/checkpoint/state_file.h"

namespace stagecoach::runtime {

// "<dir>/step-<NNNNNN>": the directory of the checkpoint holding `global_step` steps.
inline std::string CheckpointStepDir(const std::string& dir, int64_t global_step) {
  return checkpoint::CheckpointStepDirectory(dir, global_step);
}
// "stage-<s>.pt", the training-state file of a stage (what RestoreStageCheckpoint reads), and
// "stage-<s>.state_dict.pt", its export file.
using checkpoint::StageExportFileName;
using checkpoint::StageStateFileName;

// Writes stage `stage`'s checkpoint after `global_step` steps into
// CheckpointStepDir(dir, global_step) (created if needed): its training-state file and its export
// file. `params` are the stage's named parameters (StageModel::NamedParameters()), `buffers` its
// named buffers (StageModel::NamedBuffers()); `optimizer`
// is the rank's optimizer, which may hold other stages' parameters too (only this stage's state
// is written). `data_position` is where the data stream continues (the global step).
// Call between steps (not while the optimizer steps). Returns the two files' entries (file
// names relative to the step directory, sizes, SHA-256), training-state file first, for
// ReportStepRequest.checkpoint_files. Both files leave out the parameter named `omitted` (a tied
// copy, which the other stage's files hold; tied_parameters.h) and its optimizer state.
// Errors: ALREADY_EXISTS naming the path when a target file exists (nothing is overwritten);
// PERMISSION_DENIED / DATA_LOSS naming the path when it cannot be created or written;
// UNIMPLEMENTED for an optimizer other than SGD or AdamW; INTERNAL when LibTorch fails.
absl::StatusOr<std::vector<v1::StageCheckpointFile>> WriteStageCheckpoint(
    const std::string& dir, int64_t global_step, int stage,
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    const std::vector<std::pair<std::string, torch::Tensor>>& buffers,
    const torch::optim::Optimizer& optimizer, int64_t data_position,
    const std::string& omitted = "");

// A ZeRO-1 shard's layout: the stage's parameters flattened into it, in order, with their
// shapes (state_file.h, kShardLayoutKey).
using ShardLayout = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// One training-state file named `file_name` (the layout above; no export) in the checkpoint
// after `global_step` steps: `params` and their state in `optimizer` (a ZeRO-1 shard,
// zero_shards.h), no buffers, and `shard_layout` under "shard_layout" when not empty (so that a
// resume on another layout finds each parameter's state in the flat shard). Its entry; errors as
// WriteStageCheckpoint's.
absl::StatusOr<v1::StageCheckpointFile> WriteStateFile(
    const std::string& dir, int64_t global_step, int stage, const std::string& file_name,
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    const torch::optim::Optimizer& optimizer, int64_t data_position,
    const ShardLayout& shard_layout = {});

// A training-state file's contents copied to host memory (pinned when they come from a device)
// at a step boundary, so that pickling, hashing and the durable write can run off the step loop
// while training goes on (asynchronous checkpoints, task/checkpoint_steps.h). Holds no reference
// to the live parameters or optimizer.
struct StateSnapshot {
  int stage = 0;
  int64_t global_step = 0;
  int64_t data_position = 0;
  std::string file_name;                                         // stage-<s>.pt, or a shard file
  bool with_export = false;                                      // also stage-<s>.state_dict.pt
  std::vector<std::pair<std::string, torch::Tensor>> values;     // parameter -> value
  std::vector<std::pair<std::string, torch::Tensor>> optimizer;  // "<param>.<field>" -> state
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
  ShardLayout shard_layout;
};

// Copies what the file `file_name` of stage `stage` after `global_step` steps holds (with
// `with_export`, the export too): the values of `params` but `omitted`, their state in
// `optimizer`, and `buffers`. Call between steps. UNIMPLEMENTED for an optimizer other than SGD
// or AdamW; INTERNAL when LibTorch fails.
absl::StatusOr<StateSnapshot> SnapshotState(
    int stage, int64_t global_step, const std::string& file_name, bool with_export,
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    const std::vector<std::pair<std::string, torch::Tensor>>& buffers,
    const torch::optim::Optimizer& optimizer, int64_t data_position,
    const std::string& omitted = "", const ShardLayout& shard_layout = {});

// The training-state file's bytes of a snapshot (the layout above, no export): what a live
// replica sends a replacement (replica_sync.h). INTERNAL when LibTorch fails.
absl::StatusOr<std::vector<char>> PickleSnapshot(const StateSnapshot& snapshot);

// Writes a snapshot's file (and export) into CheckpointStepDir(dir, snapshot.global_step),
// durably; their entries, training-state file first. Touches only the snapshot: safe on another
// thread while training goes on. Errors as WriteStageCheckpoint's.
absl::StatusOr<std::vector<v1::StageCheckpointFile>> WriteSnapshot(const std::string& dir,
                                                                   const StateSnapshot& snapshot);

// The training-state file's entry for `stage` among a ResumeTask's files. INVALID_ARGUMENT
// ("resume.files: ...") when it is not there.
absl::StatusOr<v1::StageCheckpointFile> FindStageStateFile(const v1::ResumeTask& resume, int stage);

// Restores stage `stage` from its training-state file `file` (an entry WriteStageCheckpoint
// returned, e.g. from FindStageStateFile) in `files` (the step directory, or a snapshot's files
// in memory). In this order, and changing nothing
// until every check passed:
//   1. the file's size and SHA-256 equal the entry's (NOT_FOUND when the file is missing,
//      DATA_LOSS naming the file with the expected and actual values otherwise), and it
//      unpickles into the layout above for this stage (DATA_LOSS naming the file);
//   2. its parameters have exactly the names, shapes and dtypes of `params`, and its optimizer
//      state matches `optimizer`'s kind and the parameters' shapes (INVALID_ARGUMENT naming the
//      parameter and what differs); when `buffers` is not empty, its buffers have exactly their
//      names, shapes and dtypes (INVALID_ARGUMENT naming the buffer, or saying the file has
//      none);
// then copies the values into `params` and `buffers` (without autograd, onto their device) and
// installs their optimizer state in `optimizer` (SGD or AdamW; other parameters' state is left
// alone). Not thread-safe with respect to the parameters and the optimizer.
absl::Status RestoreStageCheckpoint(
    const StateFiles& files, const v1::StageCheckpointFile& file, int stage,
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    torch::optim::Optimizer& optimizer,
    const std::vector<std::pair<std::string, torch::Tensor>>& buffers = {});

// Steps 2 and 3 of RestoreStageCheckpoint on state already read (ReadStateFile, or gathered by
// name from another layout's files, checkpoint_by_name.h): `saved` must hold exactly `params`
// (and, when not empty, `buffers`) by name, shape and dtype, and with `optimizer` its optimizer
// state must be that kind's state of those parameters; then the values and the state are
// installed. `where` starts every error. With a null `optimizer` the state is ignored.
absl::Status RestoreSavedState(SavedState saved, const std::string& where,
                               const std::vector<std::pair<std::string, torch::Tensor>>& params,
                               torch::optim::Optimizer* optimizer,
                               const std::vector<std::pair<std::string, torch::Tensor>>& buffers);

// RestoreStageCheckpoint without an optimizer, for forward-only tasks (inference on a
// checkpoint's weights): the same checks of the file, the parameters and the buffers, then
// their values only; the file's optimizer state (whatever its kind) is ignored.
absl::Status RestoreStageParameters(
    const StateFiles& files, const v1::StageCheckpointFile& file, int stage,
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    const std::vector<std::pair<std::string, torch::Tensor>>& buffers = {});

// Restores one parameter, `copy` (name, tensor), from parameter `source` of stage `stage`'s
// training-state file `file` (a tied copy from the stage that holds it): its value, and with an
// optimizer its optimizer state. The file's checks are RestoreStageCheckpoint's; INVALID_ARGUMENT
// when the file has no `source` or it does not fit the copy.
absl::Status RestoreParameterCopy(const StateFiles& files, const v1::StageCheckpointFile& file,
                                  int stage, const std::string& source,
                                  const std::pair<std::string, torch::Tensor>& copy,
                                  torch::optim::Optimizer* optimizer);

}  // namespace stagecoach::runtime
