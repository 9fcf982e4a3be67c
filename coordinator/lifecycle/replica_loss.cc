// JobLifecycle's part for jobs whose replicas carry on without a lost one (job_lifecycle.h:
// LoseReplicasOrFailLocked, SettleFailedLocked; docs/recovery.md).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"
#include "coordinator/lifecycle/job_lifecycle.h"

namespace stagecoach::coordinator {
namespace {

// A replica failure's recovery time runs from its first report (RecoveryMetrics, kind carry_on).
void RecoveringSince(Job& job, absl::Time now) {
  if (job.recovering_since.has_value()) return;
  job.recovering_since = now;
  job.recovering_by_restart = false;
}

}  // namespace

void JobLifecycle::LoseReplicasOrFailLocked(Job& job, const std::set<int>& lost_replicas,
                                            v1::JobFailure failure, const std::string& reason) {
  if (IsFinal(job.state) || job.state == v1::JOB_STATE_RESTARTING) return;
  ReplicaHealth& health = job.replica_health;
  if (health.healing() >= 0 && lost_replicas.count(health.healing()) > 0) {
    AbandonHealLocked(job, reason);
  }
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
  RecoveringSince(job, deps_.clock->Now());
  InvestigateLocked(job, reported, epoch);
}

void JobLifecycle::LeaveReplicaLocked(Job& job, int replica, const std::string& reason) {
  ReplicaHealth& health = job.replica_health;
  const absl::Time now = deps_.clock->Now();
  RecoveringSince(job, now);
  health.Lose(replica);
  if (!job.degraded_since.has_value()) job.degraded_since = now;
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
    deps_.metrics->ReplicaHealth(job.id, health.healthy(), health.replicas());
  }
}

void JobLifecycle::StartHealing(HealOrder order) {
  deps_.executor->Run(scope_.Wrap([this, order = std::move(order)] {
    absl::Status failure;
    std::string failed_worker;
    for (const auto& [address, task] : order.tasks) {
      failure = deps_.workers->StartTask(address, task, options_.worker_rpc_timeout);
      if (!failure.ok()) {
        failed_worker = address;
        break;
      }
    }
    if (failure.ok()) return;
    absl::MutexLock lock(&deps_.table->mu());
    Job* job = deps_.table->FindLocked(order.job_id);
    if (job == nullptr || job->attempt != order.attempt ||
        job->replica_health.healing() != order.replica) {
      return;
    }
    AbandonHealLocked(*job, absl::StrCat("could not start a replacement on ", failed_worker, ": ",
                                         failure.message()));
  }));
}

void JobLifecycle::AbandonHealLocked(Job& job, const std::string& why) {
  const int replica = job.replica_health.healing();
  if (replica < 0) return;
  spdlog::warn("{}: healing replica {} abandoned: {}", job.id, replica, why);
  job.replica_health.AbandonHeal();
  for (RankSlot& slot : job.ranks) {
    if (slot.replica != replica || slot.task_ended) continue;
    slot.task_ended = true;
    slot.outcome = v1::TASK_OUTCOME_STOPPED;
    StopRankLocked(job, slot, absl::StrCat("healing replica ", replica, " abandoned: ", why));
  }
  deps_.hooks->ScheduleLocked();
}

void JobLifecycle::ReplicaHealedLocked(Job& job, int replica) {
  const ReplicaHealth& health = job.replica_health;
  const int64_t first = health.join_step() - job.attempt_base;
  for (RankSlot& slot : job.ranks) {
    if (slot.replica != replica) continue;
    slot.replica_lost = false;
    slot.first_step = first;
    slot.steps_done = first;
  }
  const absl::Time now = deps_.clock->Now();
  v1::JobEvent event;
  v1::ReplicaHealed* healed = event.mutable_replica_healed();
  healed->set_replica(replica);
  healed->set_donor_replica(health.donor());
  healed->set_joined_global_step(health.join_step());
  healed->set_healthy_replicas(health.healthy());
  healed->set_replicas(health.replicas());
  if (job.degraded_since.has_value()) {
    healed->set_degraded_seconds(absl::ToDoubleSeconds(now - *job.degraded_since));
  }
  spdlog::info("{}: replica {} rejoined at global step {} with replica {}'s state ({}/{} healthy)",
               job.id, replica, health.join_step(), health.donor(), health.healthy(),
               health.replicas());
  job.AddEvent(std::move(event), now);
  if (deps_.metrics != nullptr) {
    deps_.metrics->ReplicaHealth(job.id, health.healthy(), health.replicas());
  }
  if (!health.degraded()) job.degraded_since.reset();
  deps_.table->PersistLocked(job);
}

}  // namespace stagecoach::coordinator
