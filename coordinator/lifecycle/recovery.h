// Recovery after a coordinator restart, in two parts so that a restarted coordinator answers
// at once:
//
// RebuildJob: a job from its record, without planning or reading anything else from disk. Its
// recorded history is replayed through the state machine (so a recovered job went through
// exactly the transitions it records), and its losses, restarts, failure, step targets,
// checkpoints and plan description (layers, stages, schedule) come back. A finished job is then
// complete.
//
// A job that had not ended is `recovering` until PrepareRecovery (off every lock, in the
// background) has planned it again and checked its checkpoints, and ApplyRecovery (under the job
// table's lock) has installed them. Planning again takes the recorded partition of the layers
// (no split search) and builds the schedule; an Infer job's spec plans with the client's batch in
// place of its data (and marks the job as one). Of the checkpoints, only the one a restart would
// start from (the latest the recorded losses cover: Placement) is verified in full (sizes and
// SHA-256); older ones have their manifest read, newer ones are left for placement to set aside.
//
// What a recovered job does next (RESTARTING from its latest checkpoint, or FAILED when it
// cannot be planned again or was an Infer job whose batch was not kept) is the JobManager's.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/jobs/job.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

struct RebuiltJob {
  std::shared_ptr<Job> job;
  // The job had not ended: it needs PrepareRecovery and ApplyRecovery before it is placed.
  bool recovering = false;
};

// A job from its record (see the file comment). INVALID_ARGUMENT naming the job when its spec no
// longer parses or its history is not a path of the state machine (the job is not loaded then).
absl::StatusOr<RebuiltJob> RebuildJob(const v1::Job& record);

// What PrepareRecovery needs of a recovering job (a copy, taken under the lock).
struct RecoveryInput {
  std::string job_id;
  spec::JobSpec spec;
  std::vector<v1::LayerInfo> layers;
  std::vector<int> stage_first_layers;  // the recorded partition
  std::vector<v1::JobCheckpoint> checkpoints;
  std::optional<v1::JobCheckpoint> resumed_from;
  int64_t losses_cover = 0;  // global steps whose losses are on record (base + losses)
  static RecoveryInput Of(const Job& job);
};

struct RecoveredState {
  // The plan, or why the job cannot be planned again.
  absl::StatusOr<Plan> plan = absl::UnknownError("not planned");
  bool inference = false;  // the spec only plans with a client's batch (an Infer job)
  // Checkpoints still usable, oldest first, and the stage files of those whose manifest was read.
  std::vector<v1::JobCheckpoint> checkpoints;
  std::map<int64_t, std::vector<std::vector<v1::StageCheckpointFile>>> checkpoint_stage_files;
  // training.resume_from's files each stage reads (by the plan's stage; resume_layout.h).
  std::vector<std::vector<v1::StageCheckpointFile>> resume_files;
  bool resume_by_name = false;
  // The latest usable checkpoint when it was written on another layout than the plan's (a job
  // re-planned by restart.elastic): its files by the plan's stage; relayout_step -1 otherwise.
  int64_t relayout_step = -1;
  std::vector<std::vector<v1::StageCheckpointFile>> relayout_files;
  // Checkpoints that do not verify, naming the job.
  std::vector<std::string> problems;
};

// Plans the job again and checks its checkpoints (see the file comment). Reads the disk; takes
// no lock.
RecoveredState PrepareRecovery(const RecoveryInput& input);

// Installs `state` in `job` (plan, checkpoints) and ends its recovery; the caller holds the job
// table's lock and decides what the job does next (state.plan's error, state.inference).
void ApplyRecovery(Job& job, RecoveredState state);

}  // namespace stagecoach::coordinator
