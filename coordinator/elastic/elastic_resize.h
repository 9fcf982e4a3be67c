// When an elastic job (restart.elastic, docs/recovery.md) changes its plan, and installing the
// change. The job table's lock guards the job; planning and reading a checkpoint's manifest run
// off it (PrepareResize), as the JobManager schedules them.
//
// Shrink: a RESTARTING job (its tasks stopped, no manifest in flight) that has waited
// restart.wait since it began restarting and still finds fewer free workers than its plan needs,
// but at least restart.min_workers, is planned again on the free workers (elastic_plan.h).
// A shrunk job that restarts and finds enough free workers for its own plan goes back to it
// without waiting.
// Grow: with restart.elastic.grow (the default), a shrunk job whose checkpoint has just completed
// goes back to its own plan from that checkpoint when the free workers and its own make enough:
// it restarts (not counted against max_restarts) and the steps it ran past the checkpoint run
// again, with the same losses.
// Either way the next attempt starts from the latest checkpoint the recorded losses cover (else
// the checkpoint the job resumed from, else its initial parameters), restored by parameter name
// (resume_layout.h). A shrink prefers the latest complete in-memory snapshot where it is newer
// (and covered by the losses, and taken on the plan being left): each rank of the new plan
// receives the old stages' files that hold its layers and restores them by name; should that
// attempt fail before its first step, the restart falls back to the checkpoint. Other snapshots
// (of the old layout) are forgotten, and a grow-back starts from its checkpoint.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/checkpoints/checkpoint_manifest.h"
#include "coordinator/checkpoints/resume_layout.h"
#include "coordinator/elastic/elastic_plan.h"
#include "coordinator/jobs/job.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/workers/worker_registry.h"

namespace stagecoach::coordinator {

// A re-plan to make off the lock: the job's own spec and plan, the free workers to plan on (the
// own plan's task count: back to it), and the checkpoint the next attempt starts from.
struct ResizeOrder {
  std::string job_id;
  int attempt = 0;  // the job's attempt when ordered: a later one makes the order stale
  std::string own_yaml;
  Plan own_plan;
  int workers = 0;
  int min_workers = 1;
  std::optional<v1::JobCheckpoint> start;
  bool start_is_resume = false;  // `start` is training.resume_from, not a checkpoint of the job
  bool tied = false;             // the model keeps a tied embedding copy (TiedAcrossStages)
  // The latest complete in-memory snapshot when a shrink may start from it, and the plan that
  // took it.
  std::optional<v1::JobSnapshot> snapshot;
  Plan snapshot_plan;
};

struct ResizeResult {
  absl::StatusOr<ElasticPlan> plan = absl::UnknownError("not planned");
  // The files each stage of the new plan reads from `start` (unset without one).
  std::optional<absl::StatusOr<ResumeLayout>> layout;
  // The old stages' snapshot files each stage of the new plan reads (unset without a snapshot).
  std::optional<absl::StatusOr<ResumeLayout>> snapshot_layout;
};

// The elastic jobs to re-plan now (see the file comment); each is marked replanning.
std::vector<ResizeOrder> PlanResizesLocked(JobTable& table, const WorkerRegistry& registry,
                                           absl::Time now);

// Plans the job again and matches its starting checkpoint's manifest to the new plan. Off the
// lock; reads the manifest from disk.
ResizeResult PrepareResize(const ResizeOrder& order);

// Installs `result` in `job` when the order is still current (the job RESTARTING in the same
// attempt): its spec, spec_yaml and plan, the starting checkpoint's files by name, its own plan
// kept for growing back (or dropped when back on it). A result without a plan leaves the job
// waiting for workers (the reason says why) and no re-plan on as many workers is tried again.
// Returns whether the plan changed.
bool ApplyResizeLocked(Job& job, const ResizeOrder& order, ResizeResult result);

// Whether shrunk `job` goes back to its own plan at the checkpoint `manifest` (written in
// `step_dir`) that has just completed, and if so installs its own plan with that checkpoint's
// files by name and returns the reason to restart with; the caller restarts the job (JobLifecycle
// RestartLocked). nullopt leaves it running as it is.
std::optional<std::string> GrowAtCheckpointLocked(Job& job, const WorkerRegistry& registry,
                                                  const CheckpointManifest& manifest,
                                                  const std::string& step_dir);

}  // namespace stagecoach::coordinator
