// Queue and placement: jobs waiting for workers (PENDING, or RESTARTING once their previous
// attempt's workers are free) are placed in strict FIFO order with gang semantics: all of a
// job's ranks get idle workers of its device and transport at once, or it waits with a reason
// ("waiting for 4 workers, 2 free"; "queued behind job-3; ..."), and every later job waits
// behind it, so a large job is never starved by a stream of small ones.
//
// Placing a job starts a new attempt: it picks where the attempt starts (a restart continues
// from the latest complete checkpoint, or the latest in-memory snapshot when that is newer and
// free workers hold it), drops what the previous attempt recorded after that
// point, assigns the workers in the registry, builds each rank's TaskAssignment and moves the
// job to STARTING. The StartTask calls themselves are the caller's (JobLifecycle::StartAttempt,
// on its executor): placement does no I/O.
//
// No lock of its own: PlaceLocked runs with the job table's lock held and takes the registry's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/lifecycle/task_assignment.h"
#include "coordinator/workers/worker_registry.h"
#include "stagecoach/v1/worker.pb.h"

namespace stagecoach::coordinator {

// A placed attempt: the StartTask calls to make, in rank order.
struct StartOrder {
  std::string job_id;
  int attempt = 0;
  // (worker address, assignment) per rank.
  std::vector<std::pair<std::string, v1::TaskAssignment>> tasks;
  // A restart first moves aside the partial checkpoints the failed attempt left after the step
  // it restarts from (SetAsidePartialCheckpoints); empty dir: nothing to move.
  std::string set_aside_dir;
  int64_t set_aside_after = 0;
  std::string set_aside_tag;
};

// How many of `ranks` have workers at each host (the host of each worker address; unparsable
// addresses count by their whole text). Pure.
std::map<std::string, int> RanksByHost(const std::vector<RankSlot>& ranks);
// How many of `ranks` have workers whose address has the host of `address` (TaskAssignment's
// ranks_on_host). Pure.
int RanksOnHost(const std::vector<RankSlot>& ranks, const std::string& address);

class Placement {
 public:
  // `registry` must outlive it.
  Placement(TaskSettings settings, WorkerRegistry* registry);

  // Places what can be placed now (see the file comment) and returns the attempts to start.
  // Sets the reason of every job that keeps waiting.
  std::vector<StartOrder> PlaceLocked(JobTable& table, absl::Time now);

 private:
  // Where the new attempt of `job` starts, and the job reset to it (attempt counters, what the
  // previous attempt recorded after the starting point); `workers`: the ones of `idle` its
  // ranks take, in rank order.
  AttemptStart PrepareAttemptLocked(Job& job, bool restarting,
                                    const std::vector<WorkerRecord>& idle,
                                    std::vector<WorkerRecord>& workers);
  // A restart from the job's latest in-memory snapshot (coordinator/snapshots/) instead of
  // `start`, when the snapshot is newer and every file it restores is held by one of `idle`:
  // replaces `start` and `workers` (on the workers holding the files).
  void StartFromSnapshotLocked(Job& job, const std::vector<WorkerRecord>& idle, AttemptStart& start,
                               std::vector<WorkerRecord>& workers);
  // Holds free workers of `idle` as the job's spares (placement.spares), as many as there are.
  void HoldSparesLocked(Job& job, const std::vector<WorkerRecord>& idle);
  // Fills job.ranks from `workers` (rank r on workers[r]), assigns them and builds the order.
  StartOrder AssignRanksLocked(Job& job, const std::vector<WorkerRecord>& workers,
                               const AttemptStart& start);

  const TaskSettings settings_;
  WorkerRegistry* const registry_;
};

}  // namespace stagecoach::coordinator
