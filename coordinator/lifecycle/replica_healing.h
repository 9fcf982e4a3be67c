// Healing a lost replica on replacement workers, for jobs whose replicas carry on
// (docs/recovery.md). A RUNNING job that carries on without a lost replica takes free workers of
// its device and transport for that replica's ranks as soon as there are enough (before any
// queued job is placed: a running job's missing replica is part of what it already holds). Each
// replacement gets the lost rank's slot and a TaskAssignment with `join` (its pipeline
// rendezvouses apart from the lost one's); it sets up and asks to join, and the replica rejoins
// at the next step the healthy ones commit (ReplicaHealth).
//
// No lock of its own: called with the job table's lock held; takes the registry's. No I/O: the
// StartTask calls are JobLifecycle::StartHealing's.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "coordinator/jobs/job_table.h"
#include "coordinator/lifecycle/task_assignment.h"
#include "coordinator/workers/worker_registry.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// The StartTask calls that begin healing one replica of a job.
struct HealOrder {
  std::string job_id;
  int attempt = 0;
  int replica = 0;
  std::vector<std::pair<std::string, v1::TaskAssignment>> tasks;  // (worker address, task)
};

// Begins healing every job that can heal now (see the file comment): assigns the workers in the
// registry, gives the lost replica's slots to them and returns the orders.
std::vector<HealOrder> PlanHealsLocked(JobTable& table, WorkerRegistry& registry,
                                       const TaskSettings& settings);

}  // namespace stagecoach::coordinator
