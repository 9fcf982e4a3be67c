// The manifest of a checkpoint: <dir>/step-<NNNNNN>/manifest.json, written by the coordinator
// after every stage's files have arrived (so a directory without one is a partial checkpoint),
// and read back to verify a checkpoint before a job resumes from it (training.resume_from).
// No LibTorch: the stage files are checked by size and SHA-256 only. common/checkpoint/layout.h
// defines the layout, docs/checkpoints.md describes it.
//
// manifest.json:
//   {"format": "stagecoach-checkpoint-v1", "job_id": "job-3", "step": 40, "data_position": 40,
//    "num_stages": 2, "schedule": "1F1B",
//    "model": {"builtin": {"family": "mlp", "sizes": [...], "seed": 0}} | {"torchscript": "..."},
//    "stages": [{"stage": 0, "first_layer": 0, "end_layer": 2, "layers": ["0", "1"],
//                "files": [{"file": "stage-0.pt", "size_bytes": 123, "sha256": "..."},
//                          {"file": "stage-0.state_dict.pt", ...}]}, ...]}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/checkpoint/layout.h"
#include "common/spec/job_spec.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

using checkpoint::kManifestFileName;
inline constexpr char kManifestFormat[] = "stagecoach-checkpoint-v1";

// One stage of a checkpoint.
struct ManifestStage {
  int stage = 0;
  // The stage's layers: [first_layer, end_layer) of the model's ordered layers, and their names.
  int first_layer = 0;
  int end_layer = 0;
  std::vector<std::string> layers;
  // The stage's files (training state and export), names relative to the step directory.
  std::vector<v1::StageCheckpointFile> files;
};

struct CheckpointManifest {
  std::string job_id;
  // Steps of the job's timeline the checkpoint holds, and where the data stream continues.
  int64_t step = 0;
  int64_t data_position = 0;
  int num_stages = 0;
  // Plan::schedule_name of the job that wrote it (informational: a resume may use another).
  std::string schedule;
  // The spec's model reference as a JSON object text: {"torchscript": PATH} or {"builtin": {...}}.
  std::string model_json;
  // Indexed by stage.
  std::vector<ManifestStage> stages;
};

// The spec's model reference as CheckpointManifest::model_json wants it.
std::string ModelReferenceJson(const spec::ModelSpec& model);

// "<dir>/step-<NNNNNN>" and "<step_dir>/manifest.json" (common/checkpoint/layout.h).
using checkpoint::CheckpointStepDirectory;
using checkpoint::ManifestPath;

// Writes `manifest` as <step_dir>/manifest.json durably (common/util/durable_file.h: a
// temporary file, flushed, then linked into place), so the manifest appears whole or not at
// all. ALREADY_EXISTS naming the path when the directory already has a manifest (nothing is
// overwritten); INVALID_ARGUMENT when the manifest is inconsistent (stages not
// 0..num_stages-1, a file entry of another stage or without a name, size or checksum);
// PERMISSION_DENIED / NOT_FOUND / DATA_LOSS naming the path when it cannot be written.
absl::Status WriteManifest(const std::string& step_dir, const CheckpointManifest& manifest);

// Reads and parses <step_dir>/manifest.json. FAILED_PRECONDITION "partial checkpoint: <dir> has
// no manifest.json" when it is missing; DATA_LOSS naming the file and the field when it is
// malformed.
absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& step_dir);

// ReadManifest, then checks that every file it lists is in `step_dir` with the listed size and
// SHA-256: DATA_LOSS naming the file ("checkpoint <dir>: stage-1.pt is missing", "... has 120
// bytes, the manifest says 128", "... sha256 ... the manifest says ...").
absl::StatusOr<CheckpointManifest> VerifyCheckpoint(const std::string& step_dir);

}  // namespace stagecoach::coordinator
