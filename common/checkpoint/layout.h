// The on-disk layout of a checkpoint, the one place that spells it: the worker writes the stage
// files (worker/runtime/checkpoint/checkpoint.h), the coordinator writes and verifies the manifest
// and finds the step directories (coordinator/checkpoints/checkpoint_manifest.h), tests and tools
// read them. No LibTorch. docs/checkpoints.md describes the files.
//
//   <training.checkpoint.dir>/
//     step-<NNNNNN>/              one checkpoint: the state after NNNNNN steps of the job's
//                                 timeline (the global step, zero-padded to six digits or more)
//       stage-<s>.pt              stage s's training state (parameters, optimizer, position)
//       stage-<s>.state_dict.pt   stage s's parameters only, the export for PyTorch
//       manifest.json             written last, by the coordinator: a step directory without
//                                 it is a partial checkpoint
//
// Pure functions of their arguments; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace stagecoach::checkpoint {

inline constexpr char kManifestFileName[] = "manifest.json";

// "step-<NNNNNN>": the name of the directory of the checkpoint after `step` steps (step >= 0).
std::string StepDirectoryName(int64_t step);

// "<dir>/step-<NNNNNN>".
std::string CheckpointStepDirectory(const std::string& dir, int64_t step);

// The step of a checkpoint directory named `name` (a base name, not a path): 40 for
// "step-000040" and 1234567 for "step-1234567". nullopt for any name StepDirectoryName does not
// give: another prefix, no digits, fewer than six digits, a leading zero beyond the padding,
// a sign, or a suffix (a partial checkpoint set aside as "step-000040.partial-2").
std::optional<int64_t> StepOfCheckpointDirectory(absl::string_view name);

// "<step_dir>/manifest.json".
std::string ManifestPath(const std::string& step_dir);

// "stage-<s>.pt": the training-state file of stage `stage`.
std::string StageStateFileName(int stage);

// "stage-<s>.state_dict.pt": the export file of stage `stage`.
std::string StageExportFileName(int stage);

}  // namespace stagecoach::checkpoint
