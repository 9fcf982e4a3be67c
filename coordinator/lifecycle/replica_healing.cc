#include "coordinator/lifecycle/replica_healing.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/logging.h"

namespace stagecoach::coordinator {

std::vector<HealOrder> PlanHealsLocked(JobTable& table, WorkerRegistry& registry,
                                       const TaskSettings& settings) {
  std::vector<HealOrder> orders;
  for (Job* job : table.AllLocked()) {
    if (job->state != v1::JOB_STATE_RUNNING || job->starting || job->pausing || job->finishing) {
      continue;
    }
    ReplicaHealth& health = job->replica_health;
    const int replica = health.ReplicaToHeal();
    if (replica < 0) continue;
    std::vector<WorkerRecord> idle =
        registry.Idle(job->spec.placement.device, job->plan.transport, job->id);
    const int needed = job->plan.num_ranks;
    if (static_cast<int>(idle.size()) < needed) continue;
    health.BeginHeal(replica);
    HealOrder order;
    order.job_id = job->id;
    order.attempt = job->attempt;
    order.replica = replica;
    const int64_t step_limit = job->hold_step >= 0 ? job->hold_step : job->finish_step;
    std::vector<std::string> names;
    for (int rank = 0; rank < needed; ++rank) {
      RankSlot& slot = job->ranks[job->plan.TaskIndex(replica, rank)];
      const WorkerRecord& worker = idle[rank];
      RankSlot fresh;
      fresh.rank = slot.rank;
      fresh.replica = slot.replica;
      fresh.stages = slot.stages;
      fresh.actions = slot.actions;
      fresh.worker_id = worker.id;
      fresh.worker_address = worker.address;
      fresh.replica_lost = true;  // until it rejoins
      slot = std::move(fresh);
      v1::TaskAssignment task =
          BuildTaskAssignment(*job, slot, AttemptStart{}, step_limit, settings);
      task.mutable_join()->set_healing(health.heals());
      task.mutable_join()->set_attempt_base(job->attempt_base);
      order.tasks.emplace_back(worker.address, std::move(task));
      absl::Status assigned = registry.Assign(worker.id, job->id, rank);
      if (!assigned.ok()) spdlog::error("{}: {}", job->id, assigned.message());
      job->ForgetSpare(worker.id);  // a spare taken for the replica is one no more
      names.push_back(worker.id);
    }
    spdlog::info("{}: healing replica {} on {}", job->id, replica, absl::StrJoin(names, ", "));
    orders.push_back(std::move(order));
  }
  return orders;
}

}  // namespace stagecoach::coordinator
