// Checkpoint collection: the stage files that step reports carry become a checkpoint with a
// manifest, and checkpoints a job resumes from are verified.
//
// A checkpoint of global step s is complete when every stage's files of s have been reported:
// then its files are checked on disk and manifest.json is written last (docs/checkpoints.md),
// and only then is it listed in the job (Job::checkpoints) and used for restarts. The checks and
// the write are disk I/O, so they run without the job table's lock: AddReportedFilesLocked
// hands back a PendingManifest, the caller runs WritePendingManifest on its executor and then
// RecordCheckpointLocked under the lock again.
//
// No state of its own and no lock: the functions work on the Job they are given.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/hf/decoder_config.h"
#include "common/spec/job_spec.h"
#include "coordinator/checkpoints/checkpoint_manifest.h"
#include "coordinator/checkpoints/resume_layout.h"
#include "coordinator/jobs/job.h"
#include "coordinator/planning/planner.h"
#include "stagecoach/v1/coordinator.pb.h"

namespace stagecoach::coordinator {

// A checkpoint whose stage files have all been reported, waiting for its manifest.
struct PendingManifest {
  std::string job_id;
  std::string step_dir;  // <training.checkpoint.dir>/step-<NNNNNN>
  CheckpointManifest manifest;
  // A Llama-family model: its configuration, for the hf/ export's config.json.
  std::optional<hf::DecoderConfig> hf_config;
};

// The checkpoint part of a step report: global_step, when set, is the job's base step plus the
// steps done; every file belongs to a stage the reporting rank owns and has a plain name, a size
// and a checksum; a job that writes no checkpoints gets none. INVALID_ARGUMENT naming the field.
absl::Status ValidateCheckpointReport(const Job& job, const v1::ReportStepRequest& req);

// Records the (validated) files of `req` in `job`; when every stage's files of that global step
// are in, returns the manifest to write (and forgets the files: a checkpoint is assembled once).
// Caller holds the job table's lock.
std::optional<PendingManifest> AddReportedFilesLocked(Job& job, const v1::ReportStepRequest& req);

// The manifest of `plan`'s state after `step` (a checkpoint's, or an in-memory snapshot's as
// MatchResumeLayout reads it): each stage's layers, and its files from `files` (by stage);
// job_id and model_json are left to the caller.
CheckpointManifest ManifestOfPlan(const Plan& plan, int64_t step,
                                  const std::map<int, std::vector<v1::StageCheckpointFile>>& files);

// Checks that every file of `pending` is in its step directory with its reported size, then
// writes manifest.json (WriteManifest). DATA_LOSS naming the file and stage when one is missing
// or has another size; WriteManifest's errors otherwise. Disk I/O: call without locks.
absl::Status WritePendingManifest(const PendingManifest& pending);

// Lists the checkpoint whose manifest was written in `job` (Job::checkpoints, and its stage
// files for restarts). Caller holds the job table's lock.
void RecordCheckpointLocked(Job& job, const PendingManifest& pending);

// training.resume_from of a planned job, verified: the checkpoint (manifest present, every file
// with its size and SHA-256) and the files each of the plan's stages reads from it
// (resume_layout.h: the checkpoint may have another stage count, split or layer depth).
struct VerifiedResume {
  CheckpointManifest manifest;
  ResumeLayout layout;
};

// The verified training.resume_from of a planned job, or nullopt when the spec has none.
// INVALID_ARGUMENT "training.resume_from: ..." otherwise (MatchResumeLayout's errors name the
// layer that does not fit). Disk I/O.
absl::StatusOr<std::optional<VerifiedResume>> VerifyResumeFrom(const spec::JobSpec& spec,
                                                               const Plan& plan);

// Makes `job` start from `checkpoint` (VerifyResumeFrom's answer for job.plan): resumed_from,
// base_step, each stage's files and whether they are read by name. No-op for nullopt.
void ApplyResume(const std::optional<VerifiedResume>& checkpoint, Job& job);

// A job never overwrites a checkpoint: INVALID_ARGUMENT naming the directory when
// training.checkpoint.dir already holds a step directory the job would write (every_steps apart
// from `base_step`, and the last step). Disk I/O.
absl::Status CheckCheckpointTargetsFree(const spec::JobSpec& spec, int64_t base_step);

// Moves aside the step directories of `dir` after `after_step` that hold no manifest: partial
// checkpoints of an attempt that failed (or of tasks that ran on while the coordinator was
// down), which the next attempt would otherwise find in its way. They become
// "step-<n>.partial-<tag>". Problems are logged. Disk I/O.
void SetAsidePartialCheckpoints(const std::string& dir, int64_t after_step, const std::string& tag);

}  // namespace stagecoach::coordinator
