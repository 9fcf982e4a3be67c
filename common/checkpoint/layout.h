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
//       hf/                       a Llama-family model in Hugging Face's layout:
//         stage-<s>-<KKKKK>.safetensors   stage s's parameters under Hugging Face's names, in
//                                 parts of at most kHfShardBytes (written by the workers)
//         model.safetensors.index.json, config.json   written by the coordinator before the
//                                 manifest, so from_pretrained reads hf/ as a model directory
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

// "stage-<s>.optimizer-<k>-of-<D>.pt": replica k's ZeRO-1 optimizer shard of stage `stage`
// among D (worker/runtime/sharding/zero_shards.h).
std::string OptimizerShardFileName(int stage, int replica, int replicas);

// A shard file's stage, replica and replica count; nullopt for any other name (canonical
// spellings only: what OptimizerShardFileName gives).
struct OptimizerShardName {
  int stage = 0;
  int replica = 0;
  int replicas = 0;
};
std::optional<OptimizerShardName> ParseOptimizerShardFileName(absl::string_view name);

// The Hugging Face export's directory in a step directory, and the largest part a stage's
// tensors are cut into (save_pretrained's default max_shard_size is 5 GB).
inline constexpr char kHfDirName[] = "hf";
inline constexpr uint64_t kHfShardBytes = 5'000'000'000;

// "hf/stage-<s>-<KKKKK>.safetensors": part `part` (from 1) of stage `stage`'s export.
std::string HfShardFileName(int stage, int part);

// Whether `name` may name a checkpoint file in a manifest or a step report: a plain file name
// (no '/'), or "hf/" and a plain file name; never the manifest.
bool IsCheckpointFileName(absl::string_view name);

}  // namespace stagecoach::checkpoint
