// The job lifecycle, restart policy and failure handling: starting a placed attempt on its
// workers, ending a job (SUCCEEDED, FAILED, CANCELLED: its tasks stopped, its workers released,
// its rendezvous keys dropped), and what a failure does (a rank's task failed, a worker was lost
// or could not be reached, a control call failed): RESTARTING from the latest checkpoint while
// restart.max_restarts allows (DecideRestart), else FAILED naming the root cause (rank, worker,
// action, error; FailureInvestigation tells a lost peer from its symptom).
//
// Every state change goes through Job::TransitionTo. Calls to workers (StartTask, StopTask,
// probes) run on the executor without any lock; what they find is applied under the job table's
// lock. Methods named *Locked are called with the job table's lock held.
//
// Thread-safe. Closures it queued that run after it is destroyed do nothing.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/util/clock.h"
#include "common/util/executor.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/lifecycle/failure_investigation.h"
#include "coordinator/lifecycle/placement.h"
#include "coordinator/lifecycle/replica_healing.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "coordinator/workers/kv_store.h"
#include "coordinator/workers/worker_client.h"
#include "coordinator/workers/worker_registry.h"
#include "stagecoach/v1/coordinator.pb.h"

namespace stagecoach::coordinator {

// What the lifecycle asks of the rest of the coordinator (JobManager implements it). Both are
// called with the job table's lock held.
class LifecycleHooks {
 public:
  virtual ~LifecycleHooks() = default;
  // Workers were freed or a job queued again: place what can be placed now.
  virtual void ScheduleLocked() = 0;
  // Every rank of the job's current attempt accepted its task; the job is RUNNING or PAUSED.
  virtual void AttemptStartedLocked(Job& job) = 0;
  // A replica of the job left it and the others carry on (ReplicaHealth): steps waiting only
  // for its reports are complete now.
  virtual void ReplicaLostLocked(Job& job) = 0;
};

struct LifecycleOptions {
  // Bound on each StartTask / StopTask call.
  absl::Duration worker_rpc_timeout = absl::Seconds(10);
  // Bound on each probe of a peer of a failed rank.
  absl::Duration probe_timeout = absl::Seconds(2);
};

struct LifecycleDeps {
  JobTable* table = nullptr;
  WorkerRegistry* registry = nullptr;
  WorkerClient* workers = nullptr;
  KvStore* kv = nullptr;
  Executor* executor = nullptr;
  Clock* clock = nullptr;
  CoordinatorMetrics* metrics = nullptr;  // optional
  LifecycleHooks* hooks = nullptr;
};

// The restart policy: whether a failure of `job` (not final, not restarting) restarts it, and the
// reason its history records ("...; restart 1 of 3 from the checkpoint after step 40", or
// "... (no restart left: max_restarts 3 used)"). Infer jobs never restart. Pure.
struct RestartDecision {
  bool restart = false;
  std::string reason;
};
RestartDecision DecideRestart(const Job& job, const std::string& reason);

class JobLifecycle {
 public:
  JobLifecycle(LifecycleOptions options, LifecycleDeps deps);
  ~JobLifecycle();

  // Turns the closures it queued that have not started into no-ops and waits for running ones
  // (bounded by their calls' timeouts). The owner calls it before destroying what they use.
  void Close() { scope_.Close(); }

  // Moves aside the failed attempt's partial checkpoints (when the order says so), calls
  // StartTask for every rank in rank order (on the executor), then moves the job to RUNNING, or
  // PAUSED when it starts held. A worker that cannot be reached is lost and the job fails or
  // restarts; a task a worker refuses fails the job. An attempt that was cancelled, failed or
  // restarted meanwhile has its started tasks stopped.
  void StartAttempt(StartOrder order);

  // Ends a job that is not final: records the transition, persists it, drops its rendezvous keys
  // and stops its live tasks (their workers are released when StopTask returns).
  void EndLocked(Job& job, v1::JobState state, const std::string& reason);

  // A failure of a job that is not final (root cause in `failure`): RESTARTING per
  // DecideRestart (its tasks stopped; placement starts the next attempt once its workers are
  // free), else FAILED. No-op for a final or restarting job.
  void FailOrRestartLocked(Job& job, v1::JobFailure failure, const std::string& reason);

  // Workers of `job` were lost (`lost_replicas`: their replicas). When the job's replicas carry
  // on (ReplicaHealth::CanLose for each, one healthy replica left), each such replica leaves
  // the job: its other tasks are stopped, its workers released, a ReplicaLost event logged and
  // the step in flight is retried by the healthy replicas (SettleStep answers RETRY). Otherwise
  // FailOrRestartLocked. Lost replicas already out are ignored.
  void LoseReplicasOrFailLocked(Job& job, const std::set<int>& lost_replicas,
                                v1::JobFailure failure, const std::string& reason);

  // Calls StartTask for every replacement rank of `order` (on the executor); a replacement
  // that cannot start abandons the healing (AbandonHealLocked).
  void StartHealing(HealOrder order);

  // The healing of `job`'s healing replica failed: its replacements are stopped and released,
  // and the replica stays lost (a later healing may try again on other workers).
  void AbandonHealLocked(Job& job, const std::string& why);

  // `replica` of `job` rejoined at ReplicaHealth::join_step: its slots report from that step
  // on, a ReplicaHealed event is logged and the job is whole again once none is lost.
  void ReplicaHealedLocked(Job& job, int replica);

  // A rank of a job whose replicas carry on failed its step in the data-parallel group
  // (SettleStep with `failed`) at membership `epoch`: its peers are probed (on the executor) and
  // a lost worker's replica leaves the job, or, with none lost, the job fails or restarts. Only
  // while the membership is still `epoch` (a loss decided meanwhile explains the failure).
  void SettleFailedLocked(Job& job, const ReportedFailure& reported, int epoch);

  // A control call to `rank` failed with `error` while `doing` (e.g. "pausing job-3"): the
  // job fails or restarts, naming the rank and its worker.
  // `task`: the failed task's index in Job::ranks (Plan::TaskIndex).
  void ControlFailedLocked(Job& job, int task, const absl::Status& error, const std::string& doing);

  // Workers the registry already marked LOST (expired leases): each fails the job it ran.
  void WorkersLostLocked(const std::vector<std::string>& worker_ids);

  // A rank's task ended (ReportTaskEndRequest of the current attempt, from the rank's worker):
  // its worker stays the job's until the job ends or restarts, so a job's workers come free
  // together (gang semantics at both ends; at once when the job has already ended); SUCCEEDED from
  // every rank ends the job SUCCEEDED (an Infer job's last stage brings the outputs, checked);
  // FAILED or STOPPED starts a failure investigation (on the executor) that fails or restarts the
  // job. INVALID_ARGUMENT for a missing outcome.
  absl::Status TaskEndedLocked(Job& job, RankSlot& slot, const v1::ReportTaskEndRequest& req);

  // SUCCEEDED once every rank's task succeeded and no checkpoint of the job is still having its
  // manifest written (its final checkpoint is listed before the job ends). No-op otherwise.
  void MaybeSucceedLocked(Job& job);

  // RESTARTING for `why` without a failure (an elastic job growing back): its tasks are stopped
  // and placement starts the next attempt; not counted against restart.max_restarts.
  void RestartLocked(Job& job, const std::string& why);

 private:
  // Releases the workers of the job's ranks whose tasks have ended.
  void ReleaseEndedLocked(const Job& job);
  // Stops one rank's task on its worker and releases the worker (on the executor); a worker
  // that cannot stop it is lost.
  void StopRankLocked(const Job& job, const RankSlot& slot, const std::string& reason);
  // Marks a worker lost and fails or restarts the job it was running, naming it and its rank.
  void LoseWorkerLocked(const std::string& worker_id, const std::string& why);
  // Whether the attempt of a failed rank still needs its failure handled, and its peers that still
  // run, to probe. Takes the job table's lock.
  bool PeersToProbe(const std::string& job_id, int attempt, int rank, int replica,
                    std::vector<Peer>* peers);
  // Probes the peers of a failed rank and applies the root cause (on the executor); `epoch`
  // as in SettleFailedLocked, or -1.
  void InvestigateLocked(const Job& job, const ReportedFailure& reported, int epoch);
  // After a failed rank's peers were probed (see FailureInvestigation); `epoch` >= 0: only
  // while the job's membership is still that epoch.
  void ApplyRootCauseLocked(const std::string& job_id, int attempt, int epoch,
                            const RootCause& cause);
  // One replica leaves a job that carries on (LoseReplicasOrFailLocked).
  void LeaveReplicaLocked(Job& job, int replica, const std::string& reason);
  // The StartTask calls of an attempt returned: `failure` of `failed_rank`, or OK.
  void AttemptStartedOrFailedLocked(const std::string& job_id, int attempt,
                                    const absl::Status& failure, int failed_rank);

  const LifecycleOptions options_;
  const LifecycleDeps deps_;
  const FailureInvestigation investigation_;
  TaskScope scope_;  // declared last: closed first in the destructor
};

}  // namespace stagecoach::coordinator
