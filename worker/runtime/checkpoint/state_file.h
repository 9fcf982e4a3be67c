// A training-state file (checkpoint.h's layout: stage-<s>.pt, or a ZeRO-1 shard file
// stage-<s>.optimizer-<k>-of-<D>.pt), read back, verified and unpickled, changing nothing: what
// RestoreStageCheckpoint installs, and what CheckpointByName (checkpoint_by_name.h) gathers by
// parameter name from the files of a checkpoint written on another layout.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::runtime {

struct SavedState {
  // {parameter name -> tensor}, and the names in the file's order (the stage's parameter order).
  std::map<std::string, torch::Tensor> params;
  std::vector<std::string> param_order;
  // {"<param>.<field>" -> tensor}.
  std::map<std::string, torch::Tensor> optimizer;
  // Absent in files written before buffers were kept.
  std::optional<std::map<std::string, torch::Tensor>> buffers;
  // A shard file's layout: the stage's parameters flattened into it, in order, with their
  // shapes (zero_shards.h); empty in other files and in shard files written before it was kept.
  std::vector<std::pair<std::string, std::vector<int64_t>>> shard_layout;
  int64_t stage = -1;
  int64_t step = -1;
  int64_t data_position = -1;
};

// Where a checkpoint's files are read from: its step directory on disk, or files already in
// memory (an in-memory snapshot's, exchanged at an attempt's start: snapshot/snapshot_restore.h).
// Immutable; copies share the bytes.
class StateFiles {
 public:
  using Bytes = std::shared_ptr<const std::vector<char>>;

  // A step directory (implicit: most callers name one).
  StateFiles(std::string step_dir);                                        // NOLINT
  StateFiles(const char* step_dir) : StateFiles(std::string(step_dir)) {}  // NOLINT
  // Files in memory by name; `name` describes them in errors ("the snapshot after step 20").
  StateFiles(std::string name, std::map<std::string, Bytes> files);

  // The directory, or the in-memory files' name.
  const std::string& name() const { return name_; }
  // Where `file` is, for errors: its path, or "<name>: <file>".
  std::string Where(const std::string& file) const;
  // The bytes of `file`: NOT_FOUND naming Where(file) when it is not there, DATA_LOSS when the
  // disk fails.
  absl::StatusOr<Bytes> Read(const std::string& file) const;

 private:
  std::string name_;
  std::optional<std::map<std::string, Bytes>> memory_;
};

// Reads training-state file `file` (an entry of the checkpoint's, e.g. from a ResumeTask) in
// `files` and checks it: a plain file name (INVALID_ARGUMENT), the entry is stage `stage`'s
// (INVALID_ARGUMENT), the file is there (NOT_FOUND naming the path) with the entry's size and
// SHA-256 (DATA_LOSS naming the path, the expected and the actual value), it unpickles into the
// layout and holds stage `stage` (DATA_LOSS naming the path and the key).
absl::StatusOr<SavedState> ReadStateFile(const StateFiles& files,
                                         const v1::StageCheckpointFile& file, int stage);

// A training-state file's bytes unpickled and checked against the layout (DATA_LOSS naming
// `where` and the key): what ReadStateFile does once it has read the file and checked its
// entry, for bytes that came another way (a live replica's, replica_sync.h).
absl::StatusOr<SavedState> ParseStateBytes(const std::vector<char>& bytes,
                                           const std::string& where);

// "Float[3, 4]": a tensor's dtype and shape, for errors.
std::string DescribeTensor(const torch::Tensor& t);

// The key under which a shard file keeps its layout.
inline constexpr char kShardLayoutKey[] = "shard_layout";

}  // namespace stagecoach::runtime
