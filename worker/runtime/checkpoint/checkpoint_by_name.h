// A checkpoint's training state by parameter name, whatever layout wrote it: a job resumed on
// another stage count, other split points, another nesting depth of its layers, another
// schedule, replica count or shard level (ResumeTask.by_name) finds each of its parameters,
// buffers and their optimizer state under the parameter's own (original) name, in whichever
// checkpoint stage holds it. ZeRO-1 shard files (zero_shards.h) are reassembled into each
// parameter's state by the layout the shard file keeps.
//
// Not thread-safe; holds the tensors of the files it read (CPU memory).
#pragma once

#include <torch/types.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "stagecoach/v1/types.pb.h"
#include "worker/runtime/checkpoint/optimizer_state.h"
#include "worker/runtime/checkpoint/state_file.h"

namespace stagecoach::runtime {

class CheckpointByName {
 public:
  // Reads every training-state file among `resume.files()` (exports are skipped): each
  // checkpoint stage's stage-<s>.pt (parameters, buffers and, unless the stage was sharded,
  // per-parameter optimizer state) and its optimizer shard files (all D of one set), verified
  // as ReadStateFile does. DATA_LOSS naming the file when a stage's shard files do not make one
  // set, when a shard file has no layout (written before layouts were kept: resume it on its
  // own layout) or its layout does not add up to the shard, or when a parameter is held by two
  // checkpoint stages with different values' shapes; ReadStateFile's errors otherwise.
  static absl::StatusOr<CheckpointByName> Read(const v1::ResumeTask& resume);
  // The same from `files` (the step directory, or an in-memory snapshot's files exchanged at
  // the attempt's start: snapshot/snapshot_restore.h), which errors name.
  static absl::StatusOr<CheckpointByName> Read(const v1::ResumeTask& resume,
                                               const StateFiles& files);

  // The state of one stage of the resuming job, as RestoreSavedState (checkpoint.h) installs
  // it: each of `params` with its value and optimizer state, each of `buffers`, under their
  // names; a name in `aliases` whose own entry the checkpoint lacks takes the entry of the name
  // it maps to (a tied copy the checkpoint holds once, tied_parameters.h). INVALID_ARGUMENT
  // naming the parameter (or buffer), the stage and the checkpoint stages read when one is in
  // none of them; when a buffer is missing because a file predates buffers, says so.
  absl::StatusOr<SavedState> StateFor(
      int stage, const std::vector<std::pair<std::string, torch::Tensor>>& params,
      const std::vector<std::pair<std::string, torch::Tensor>>& buffers,
      const std::map<std::string, std::string>& aliases) const;

  // The checkpoint's stages read, and the step it holds.
  const std::set<int>& stages() const { return stages_; }

 private:
  absl::Status AddStageFile(const SavedState& file, const std::string& name);
  absl::Status AddShards(int stage, const std::vector<SavedState>& shards,
                         const std::string& first_file);
  std::string Where() const;

  std::string dir_;
  std::set<int> stages_;
  int64_t step_ = 0;
  std::map<std::string, torch::Tensor> params_;
  std::map<std::string, torch::Tensor> buffers_;
  std::map<std::string, StateFields> optimizer_;  // parameter -> field -> tensor
  bool some_without_buffers_ = false;
};

}  // namespace stagecoach::runtime
