#include "coordinator/control/step_settlement.h"

#include <algorithm>
#include <climits>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/time_conversion.h"
#include "coordinator/lifecycle/failure_investigation.h"

namespace stagecoach::coordinator {
namespace {

bool Stopped(const Job& job, int attempt) {
  return job.attempt != attempt || IsFinal(job.state) || job.state == v1::JOB_STATE_RESTARTING;
}

v1::SettleStepResponse Stop(const std::string& reason) {
  v1::SettleStepResponse out;
  out.set_decision(v1::SettleStepResponse::STOP);
  out.set_reason(reason);
  return out;
}

// The membership `replica` runs with now.
v1::SettleStepResponse Membership(const Job& job, int replica,
                                  v1::SettleStepResponse::Decision decision) {
  v1::SettleStepResponse out;
  out.set_decision(decision);
  const ReplicaHealth& health = job.replica_health;
  out.set_epoch(health.epoch());
  for (int r : health.HealthyReplicas()) out.add_healthy_replicas(r);
  for (int s : health.SlicesOf(replica)) out.add_slices(s);
  out.set_join_global_step(health.join_step());
  out.set_donor_replica(health.donor());
  if (decision == v1::SettleStepResponse::RETRY) {
    out.set_reason(absl::StrCat("replicas ", health.healthy(), "/", health.replicas(),
                                " healthy (epoch ", health.epoch(), ")"));
  }
  return out;
}

// A healed replica is taken back in only before a step that will run: not when the job holds
// or ends at the next step, nor while a pause or the end is being arranged.
int64_t RejoinBefore(const Job& job) {
  if (job.pausing || job.finishing) return INT64_MIN;
  int64_t before = job.finish_step;
  if (job.hold_step >= 0) before = std::min(before, job.hold_step);
  return before;
}

}  // namespace

absl::StatusOr<v1::SettleStepResponse> StepSettlement::Join(Job& job,
                                                            const v1::SettleStepRequest& req,
                                                            absl::Duration wait) {
  ReplicaHealth& health = job.replica_health;
  if (health.healing() != req.replica() || !health.IsLost(req.replica())) {
    if (!health.IsLost(req.replica()) && health.join_step() >= 0) {
      return Joined(job, req.replica());  // asking again after the rejoin
    }
    return Stop(absl::StrCat("replica ", req.replica(), " of ", job.id, " is not being healed"));
  }
  health.JoinerReady(req.rank());
  const int attempt = req.attempt();
  const int heals = health.heals();
  auto decided = [&]() {
    return Stopped(job, attempt) || !job.replica_health.IsLost(req.replica()) ||
           job.replica_health.heals() != heals || job.replica_health.healing() != req.replica();
  };
  deps_.table->mu().AwaitWithTimeout(absl::Condition(&decided), wait);
  if (Stopped(job, attempt)) {
    return Stop(absl::StrCat(job.id, " ", JobStateName(job.state), ": ", job.reason));
  }
  if (!health.IsLost(req.replica())) return Joined(job, req.replica());
  if (health.healing() != req.replica() || health.heals() != heals) {
    return Stop(
        absl::StrCat("the healing of replica ", req.replica(), " of ", job.id, " was abandoned"));
  }
  v1::SettleStepResponse out;
  out.set_decision(v1::SettleStepResponse::WAIT);
  return out;
}

v1::SettleStepResponse StepSettlement::Joined(const Job& job, int replica) {
  v1::SettleStepResponse out = Membership(job, replica, v1::SettleStepResponse::JOIN);
  out.set_step_limit(job.hold_step >= 0 ? job.hold_step : job.finish_step);
  out.set_finish_at_limit(job.finishing);
  return out;
}

absl::StatusOr<v1::SettleStepResponse> StepSettlement::Settle(const v1::SettleStepRequest& req) {
  if (req.global_step() < 0 || req.step() < 0) {
    return absl::InvalidArgumentError("step, global_step: must be >= 0");
  }
  if (req.epoch() < 0) return absl::InvalidArgumentError("epoch: must be >= 0");
  absl::Duration wait = rpc::FromProtoDuration(req.wait());
  if (wait <= absl::ZeroDuration() || wait > kMaxWait) wait = kMaxWait;
  absl::Mutex& mu = deps_.table->mu();
  absl::MutexLock lock(&mu);
  std::shared_ptr<Job> job = deps_.table->ShareLocked(req.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("job ", req.job_id(), " not found"));
  if (Stopped(*job, req.attempt()))
    return Stop(absl::StrCat(job->id, " is not running attempt ", req.attempt()));
  const int index = job->plan.TaskIndex(req.replica(), req.rank());
  if (req.rank() < 0 || req.rank() >= job->plan.num_ranks || req.replica() < 0 ||
      index >= static_cast<int>(job->ranks.size()) ||
      job->ranks[index].worker_id != req.worker_id()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SettleStep from worker ", req.worker_id(), " for ", job->id, " rank ", req.rank(),
        " replica ", req.replica(), " does not match the job's current placement"));
  }
  ReplicaHealth& health = job->replica_health;
  if (!health.carry_on()) {
    return absl::FailedPreconditionError(absl::StrCat(
        job->id, " does not carry on without lost replicas: its steps are not settled"));
  }
  if (req.joining()) return Join(*job, req, wait);
  if (health.IsLost(req.replica())) {
    return Stop(absl::StrCat("replica ", req.replica(), " has left ", job->id));
  }
  ReplicaHealth::Arrival arrival;
  arrival.replica = req.replica();
  arrival.rank = req.rank();
  arrival.epoch = req.epoch();
  arrival.global_step = req.global_step();
  arrival.failed = req.failed();
  arrival.losses.assign(req.microbatch_losses().begin(), req.microbatch_losses().end());
  arrival.slices.assign(req.slices().begin(), req.slices().end());
  std::map<int, std::vector<double>> losses;
  const int healing = health.healing();
  const ReplicaHealth::Answer first = health.Arrive(arrival, &losses, RejoinBefore(*job));
  if (first == ReplicaHealth::Answer::kCommit && !losses.empty()) {
    StepAggregator::AddSettledLossesLocked(*job, req.global_step() - job->attempt_base,
                                           std::move(losses));
  }
  if (healing >= 0 && !health.IsLost(healing)) deps_.lifecycle->ReplicaHealedLocked(*job, healing);
  if (req.failed() && first == ReplicaHealth::Answer::kPending) {
    deps_.lifecycle->SettleFailedLocked(
        *job, ReportedFailure{req.rank(), req.worker_id(), req.error(), req.replica()},
        req.epoch());
  }
  const int attempt = req.attempt();
  const int epoch = req.epoch();
  const int64_t step = req.global_step();
  auto decided = [&]() {
    return Stopped(*job, attempt) || job->replica_health.IsLost(req.replica()) ||
           job->replica_health.AnswerFor(epoch, step) != ReplicaHealth::Answer::kPending;
  };
  mu.AwaitWithTimeout(absl::Condition(&decided), wait);
  if (Stopped(*job, attempt)) {
    return Stop(absl::StrCat(job->id, " ", JobStateName(job->state), ": ", job->reason));
  }
  if (health.IsLost(req.replica())) {
    return Stop(absl::StrCat("replica ", req.replica(), " has left ", job->id));
  }
  switch (health.AnswerFor(epoch, step)) {
    case ReplicaHealth::Answer::kCommit:
      return Membership(*job, req.replica(), v1::SettleStepResponse::COMMIT);
    case ReplicaHealth::Answer::kRetry:
      return Membership(*job, req.replica(), v1::SettleStepResponse::RETRY);
    case ReplicaHealth::Answer::kPending:
      break;
  }
  v1::SettleStepResponse out;
  out.set_decision(v1::SettleStepResponse::WAIT);
  return out;
}

}  // namespace stagecoach::coordinator
