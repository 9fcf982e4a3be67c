// The TaskAssignment a rank's worker gets for one attempt of a placed job (what StartTask
// carries): its stages, lowered actions, the spec, the rendezvous prefix, the step limit and
// hold timeout, checkpoint steps, the checkpoint to restore, and an Infer job's batch. Built
// from the job alone; placement decides which worker gets which rank.
#pragma once

#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/jobs/job.h"
#include "stagecoach/v1/types.pb.h"
#include "stagecoach/v1/worker.pb.h"

namespace stagecoach::coordinator {

// What every task of the coordinator carries besides the job's own data.
struct TaskSettings {
  // Bound on every data-plane wait inside the task.
  absl::Duration comm_timeout = absl::Seconds(60);
  // Longest the task holds at a step boundary before it gives up.
  absl::Duration hold_timeout = absl::Hours(24);
};

// The checkpoint an attempt starts from, with the files each of the plan's stages reads
// (indexed by stage), and whether they are read by parameter name (written on another layout,
// coordinator/checkpoints/resume_layout.h).
//
// An attempt that starts from an in-memory snapshot (coordinator/snapshots/) has `snapshot`: its
// transfers; `checkpoint` then only gives the step (and names the snapshot), and `stage_files`
// the snapshot's files by stage.
struct AttemptStart {
  std::optional<v1::JobCheckpoint> checkpoint;
  std::vector<std::vector<v1::StageCheckpointFile>> stage_files;
  bool by_name = false;
  std::optional<v1::SnapshotRestore> snapshot;
};

// In-memory snapshots (training.snapshot): for each rank of the pipeline (replica 0's `ranks`,
// by rank), the rank whose worker keeps a copy of its files: the next rank after it on another
// host, else the next rank; -1 for a single rank. Pure.
std::vector<int> SnapshotHolders(const std::vector<RankSlot>& ranks, int num_ranks);

// The assignment of `slot` (a rank of `job`'s current attempt: job.attempt, job.ranks filled in
// by placement), starting at `start`, holding at `step_limit`. Pure.
v1::TaskAssignment BuildTaskAssignment(const Job& job, const RankSlot& slot,
                                       const AttemptStart& start, int64_t step_limit,
                                       const TaskSettings& settings);

}  // namespace stagecoach::coordinator
