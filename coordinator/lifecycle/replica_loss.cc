// JobLifecycle's part for jobs whose replicas carry on without a lost one (job_lifecycle.h:
// LoseReplicasOrFailLocked, SettleFailedLocked; docs/recovery.md).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"
#include "coordinator/lifecycle/job_lifecycle.h"

namespace stagecoach::coordinator {

void JobLifecycle::LoseReplicasOrFailLocked(Job& job, const std::set<int>& lost_replicas,
                                            v1::JobFailure failure, const std::string& reason) {
  if (IsFinal(job.state) || job.state == v1::JOB_STATE_RESTARTING) return;
  ReplicaHealth& health = job.replica_health;
  std::set<int> leaving;
  for (int replica : lost_replicas) {
    if (!health.IsLost(replica)) leaving.insert(replica);
  }
  if (leaving.empty() && health.carry_on()) return;  // those replicas already left
  const bool carry_on = health.carry_on() && !job.starting &&
                        (job.state == v1::JOB_STATE_RUNNING || job.state == v1::JOB_STATE_PAUSED) &&
                        static_cast<int>(leaving.size()) < health.healthy();
  if (!carry_on) {
    FailOrRestartLocked(job, std::move(failure), reason);
    return;
  }
  *failure.mutable_time() = rpc::ToProtoTimestamp(deps_.clock->Now());
  job.failure = std::move(failure);
  for (int replica : leaving) LeaveReplicaLocked(job, replica, reason);
  deps_.table->PersistLocked(job);
  deps_.hooks->ReplicaLostLocked(job);
}

void JobLifecycle::SettleFailedLocked(Job& job, const ReportedFailure& reported, int epoch) {
  if (!job.recovering_since.has_value()) {
    job.recovering_since = deps_.clock->Now();
    job.recovering_by_restart = false;
  }
  InvestigateLocked(job, reported, epoch);
}

void JobLifecycle::LeaveReplicaLocked(Job& job, int replica, const std::string& reason) {
  ReplicaHealth& health = job.replica_health;
  const absl::Time now = deps_.clock->Now();
  if (!job.recovering_since.has_value()) {
    job.recovering_since = now;
    job.recovering_by_restart = false;
  }
  health.Lose(replica);
  const std::string why =
      absl::StrCat("replica ", replica, " left the job: ", reason, "; carrying on with replicas ",
                   absl::StrJoin(health.HealthyReplicas(), ", "), " (", health.healthy(), "/",
                   health.replicas(), " healthy)");
  spdlog::warn("{}: {}", job.id, why);
  for (RankSlot& slot : job.ranks) {
    if (slot.replica != replica) continue;
    slot.replica_lost = true;
    if (slot.task_ended) {
      deps_.registry->Release(slot.worker_id, job.id);
      continue;
    }
    slot.task_ended = true;
    slot.outcome = v1::TASK_OUTCOME_STOPPED;
    StopRankLocked(job, slot, why);  // releases the worker once stopped (a lost one is not)
  }
  v1::JobEvent event;
  v1::ReplicaLost* lost = event.mutable_replica_lost();
  lost->set_replica(replica);
  lost->set_reason(reason);
  lost->set_healthy_replicas(health.healthy());
  lost->set_replicas(health.replicas());
  lost->set_retried_global_step(std::max(health.last_committed() + 1, job.attempt_base));
  lost->set_decided_after_seconds(absl::ToDoubleSeconds(now - *job.recovering_since));
  job.AddEvent(std::move(event), now);
  if (deps_.metrics != nullptr) {
    deps_.metrics->ReplicaLost(job.id, health.healthy(), health.replicas());
  }
}

}  // namespace stagecoach::coordinator
