#include "coordinator/lifecycle/job_lifecycle.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rpc/tensor_data.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "coordinator/checkpoints/checkpoint_collection.h"

namespace stagecoach::coordinator {
namespace {

v1::JobFailure LostFailure(const RankSlot& slot, const std::string& why) {
  v1::JobFailure failure;
  failure.set_rank(slot.rank);
  failure.set_replica(slot.replica);
  failure.set_worker_id(slot.worker_id);
  failure.set_error(absl::StrCat("lost: ", why));
  return failure;
}

// Where a restart continues from, for its reason.
std::string RestartPoint(const Job& job) {
  // Placement takes the snapshot when its holders are free then; the checkpoint otherwise.
  const std::optional<v1::JobSnapshot>& snapshot = job.snapshots.latest();
  if (snapshot.has_value() &&
      (job.checkpoints.empty() || snapshot->step() > job.checkpoints.back().step())) {
    return absl::StrCat("the in-memory snapshot after step ", snapshot->step(),
                        job.checkpoints.empty() ? ""
                                                : absl::StrCat(" (else the checkpoint after step ",
                                                               job.checkpoints.back().step(), ")"));
  }
  if (!job.checkpoints.empty()) {
    return absl::StrCat("the checkpoint after step ", job.checkpoints.back().step());
  }
  return job.resumed_from.has_value() ? "the checkpoint it resumed from"
                                      : "its initial parameters (no checkpoint yet)";
}

// The last stage's outputs of an Infer job are one tensor with a row per input row.
absl::Status CheckInferenceOutputs(const Job& job, const v1::ReportTaskEndRequest& req) {
  if (!req.has_inference_outputs()) return absl::InvalidArgumentError("inference_outputs: missing");
  const v1::TensorData& out = req.inference_outputs();
  RETURN_IF_ERROR(rpc::ValidateTensorData(out, "inference_outputs"));
  // The rows of the reporting replica's share of the batch.
  const int64_t rows = rpc::ReplicaRows(job.inference_inputs.shape(0), job.plan.num_microbatches,
                                        job.plan.replicas, req.replica());
  if (out.shape_size() < 1 || out.shape(0) != rows) {
    return absl::InvalidArgumentError(absl::StrCat("inference_outputs: expected ", rows,
                                                   " rows (one per input row), got ",
                                                   rpc::DescribeTensorData(out)));
  }
  return absl::OkStatus();
}

}  // namespace

RestartDecision DecideRestart(const Job& job, const std::string& reason) {
  const int max = job.spec.restart.max_restarts;
  if (job.inference || job.restarts >= max) {
    std::string why = reason;
    if (max > 0 && !job.inference) {
      absl::StrAppend(&why, " (no restart left: max_restarts ", max, " used)");
    }
    return {false, why};
  }
  return {true, absl::StrCat(reason, "; restart ", job.restarts + 1, " of ", max, " from ",
                             RestartPoint(job))};
}

JobLifecycle::JobLifecycle(LifecycleOptions options, LifecycleDeps deps)
    : options_(options), deps_(deps), investigation_(deps.workers, options.probe_timeout) {}

JobLifecycle::~JobLifecycle() { scope_.Close(); }

void JobLifecycle::StartAttempt(StartOrder order) {
  deps_.executor->Run(scope_.Wrap([this, order = std::move(order)] {
    if (!order.set_aside_dir.empty()) {
      SetAsidePartialCheckpoints(order.set_aside_dir, order.set_aside_after, order.set_aside_tag);
    }
    absl::Status failure;
    int failed_rank = -1;
    for (const auto& [address, task] : order.tasks) {
      absl::Status started = deps_.workers->StartTask(address, task, options_.worker_rpc_timeout);
      if (!started.ok()) {
        failure = started;
        failed_rank = task.replica() * task.world_size() + task.rank();  // its task index
        break;
      }
    }
    absl::MutexLock lock(&deps_.table->mu());
    AttemptStartedOrFailedLocked(order.job_id, order.attempt, failure, failed_rank);
  }));
}

void JobLifecycle::AttemptStartedOrFailedLocked(const std::string& job_id, int attempt,
                                                const absl::Status& failure, int failed_rank) {
  Job* job = deps_.table->FindLocked(job_id);
  if (job == nullptr || job->attempt != attempt) return;
  job->starting = false;
  if (job->state != v1::JOB_STATE_STARTING) {
    // Cancelled, failed or restarting meanwhile: stop what was started (StopTask is idempotent).
    for (const RankSlot& slot : job->ranks) StopRankLocked(*job, slot, job->reason);
    return;
  }
  if (!failure.ok()) {
    const RankSlot& slot = job->ranks[failed_rank];
    const bool unreachable = absl::IsUnavailable(failure) || absl::IsDeadlineExceeded(failure);
    if (unreachable) {
      deps_.registry->MarkLost(slot.worker_id, absl::StrCat("unreachable: ", failure.message()));
    }
    v1::JobFailure cause;
    cause.set_rank(slot.rank);
    cause.set_replica(slot.replica);
    cause.set_worker_id(slot.worker_id);
    cause.set_error(absl::StrCat("StartTask: ", failure.message()));
    const std::string reason = absl::StrCat("could not start ", RankLabel(slot.rank, slot.replica),
                                            " on worker ", slot.worker_id, ": ", failure.message());
    // Only a worker that vanished is worth another attempt; a refused task would be refused
    // again.
    if (unreachable) {
      FailOrRestartLocked(*job, cause, reason);
    } else {
      job->failure = cause;
      EndLocked(*job, v1::JOB_STATE_FAILED, reason);
    }
    deps_.hooks->ScheduleLocked();
    return;
  }
  const bool held = job->hold_step >= 0 && job->hold_step == job->attempt_base;
  absl::Status moved =
      job->TransitionTo(held ? v1::JOB_STATE_PAUSED : v1::JOB_STATE_RUNNING,
                        held ? absl::StrCat("holding at global step ", job->hold_step, " on ",
                                            job->ranks.size(), " workers")
                             : absl::StrCat("running on ", job->ranks.size(), " workers"),
                        deps_.clock->Now());
  if (!moved.ok()) spdlog::error("{}: {}", job->id, moved.message());
  deps_.table->PersistLocked(*job);
  deps_.hooks->AttemptStartedLocked(*job);
}

void JobLifecycle::EndLocked(Job& job, v1::JobState state, const std::string& reason) {
  absl::Status moved = job.TransitionTo(state, reason, deps_.clock->Now());
  if (!moved.ok()) {
    spdlog::error("{}: {}", job.id, moved.message());
    return;
  }
  spdlog::info("{} {}: {}", job.id, JobStateName(state), reason);
  deps_.table->PersistLocked(job);
  deps_.kv->DeletePrefix(job.RendezvousPrefix());
  if (deps_.metrics != nullptr && job.replica_health.degraded()) {
    deps_.metrics->ReplicaHealth(job.id, job.plan.replicas, job.plan.replicas);  // over
  }
  // A finished Infer job needs only its outputs, and no spares.
  job.inference_inputs.Clear();
  deps_.registry->Unreserve(job.id);
  job.spare_workers.clear();
  ReleaseEndedLocked(job);
  if (job.starting) return;  // StartAttempt stops the ranks once its calls return
  for (const RankSlot& slot : job.ranks) {
    if (!slot.task_ended) StopRankLocked(job, slot, reason);
  }
}

void JobLifecycle::ReleaseEndedLocked(const Job& job) {
  for (const RankSlot& slot : job.ranks) {
    if (slot.task_ended) deps_.registry->Release(slot.worker_id, job.id);
  }
}

void JobLifecycle::FailOrRestartLocked(Job& job, v1::JobFailure failure,
                                       const std::string& reason) {
  if (IsFinal(job.state) || job.state == v1::JOB_STATE_RESTARTING) return;
  *failure.mutable_time() = rpc::ToProtoTimestamp(deps_.clock->Now());
  job.failure = failure;
  const RestartDecision decision = DecideRestart(job, reason);
  if (!decision.restart) {
    EndLocked(job, v1::JOB_STATE_FAILED, decision.reason);
    return;
  }
  ++job.restarts;
  if (deps_.metrics != nullptr) {
    deps_.metrics->JobRestarted();
    // The next attempt starts whole.
    if (job.plan.replicas > 1)
      deps_.metrics->ReplicaHealth(job.id, job.plan.replicas, job.plan.replicas);
  }
  job.recovering_since = deps_.clock->Now();
  job.recovering_by_restart = true;
  job.global_done_at_failure = job.global_done();
  RestartLocked(job, decision.reason);
}

void JobLifecycle::RestartLocked(Job& job, const std::string& why) {
  absl::Status moved = job.TransitionTo(v1::JOB_STATE_RESTARTING, why, deps_.clock->Now());
  if (!moved.ok()) {
    spdlog::error("{}: {}", job.id, moved.message());
    return;
  }
  spdlog::warn("{} RESTARTING: {}", job.id, why);
  deps_.kv->DeletePrefix(job.RendezvousPrefix());
  job.pausing = false;
  job.finishing = false;
  ReleaseEndedLocked(job);
  if (!job.starting) {
    for (const RankSlot& slot : job.ranks) {
      if (!slot.task_ended) StopRankLocked(job, slot, why);
    }
  }
  deps_.table->PersistLocked(job);
}

void JobLifecycle::ControlFailedLocked(Job& job, int task, const absl::Status& error,
                                       const std::string& doing) {
  v1::JobFailure cause;
  cause.set_rank(task);
  if (task >= 0 && task < static_cast<int>(job.ranks.size())) {
    cause.set_rank(job.ranks[task].rank);
    cause.set_replica(job.ranks[task].replica);
    cause.set_worker_id(job.ranks[task].worker_id);
  }
  cause.set_error(absl::StrCat("ControlTask: ", error.message()));
  FailOrRestartLocked(job, cause, absl::StrCat(doing, ": ", error.message()));
  deps_.hooks->ScheduleLocked();
}

void JobLifecycle::StopRankLocked(const Job& job, const RankSlot& slot, const std::string& reason) {
  const std::optional<WorkerRecord> w = deps_.registry->Find(slot.worker_id);
  if (!w.has_value() || w->state == v1::WORKER_STATE_LOST) return;
  deps_.executor->Run(scope_.Wrap(
      [this, job_id = job.id, worker_id = slot.worker_id, address = slot.worker_address, reason] {
        absl::Status stopped =
            deps_.workers->StopTask(address, job_id, reason, options_.worker_rpc_timeout);
        absl::MutexLock lock(&deps_.table->mu());
        if (stopped.ok()) {
          deps_.registry->Release(worker_id, job_id);
        } else {
          spdlog::warn("stopping {} on {}: {}", job_id, worker_id, stopped.message());
          LoseWorkerLocked(worker_id, absl::StrCat("could not stop its task: ", stopped.message()));
        }
        deps_.hooks->ScheduleLocked();
      }));
}

void JobLifecycle::LoseWorkerLocked(const std::string& worker_id, const std::string& why) {
  deps_.registry->MarkLost(worker_id, why);
  WorkersLostLocked({worker_id});
}

void JobLifecycle::WorkersLostLocked(const std::vector<std::string>& worker_ids) {
  for (const std::string& id : worker_ids) {
    const std::optional<WorkerRecord> w = deps_.registry->Find(id);
    const std::string why = w.has_value() ? w->reason : "lost";
    for (Job* job : deps_.table->AllLocked()) {
      if (IsFinal(job->state) || job->state == v1::JOB_STATE_RESTARTING) continue;
      for (const RankSlot& slot : job->ranks) {
        if (slot.worker_id == id && !slot.task_ended) {
          LoseReplicasOrFailLocked(
              *job, {slot.replica}, LostFailure(slot, why),
              absl::StrCat(WorkerLabel(slot.worker_id, slot.rank, slot.replica), " lost: ", why));
          break;
        }
      }
    }
  }
}

absl::Status JobLifecycle::TaskEndedLocked(Job& job, RankSlot& slot,
                                           const v1::ReportTaskEndRequest& req) {
  if (slot.task_ended) return absl::OkStatus();
  if (slot.replica_lost && job.replica_health.healing() == slot.replica &&
      req.outcome() != v1::TASK_OUTCOME_SUCCEEDED) {
    // A replacement that failed before its replica rejoined: the job goes on degraded.
    AbandonHealLocked(job, absl::StrCat(RankLabel(slot.rank, slot.replica), "'s replacement on ",
                                        slot.worker_id, " ended: ", req.error()));
    return absl::OkStatus();
  }
  slot.task_ended = true;
  slot.outcome = req.outcome();
  slot.error = req.error();
  if (IsFinal(job.state) || job.state == v1::JOB_STATE_RESTARTING) {
    deps_.registry->Release(slot.worker_id, job.id);
    deps_.hooks->ScheduleLocked();  // a restarting job waits for its workers to be released
    return absl::OkStatus();
  }
  // Otherwise the worker stays the job's until the job ends or restarts (ReleaseEndedLocked):
  // gang semantics at both ends.
  switch (req.outcome()) {
    case v1::TASK_OUTCOME_SUCCEEDED: {
      if (job.inference && job.plan.stage_to_rank[job.plan.num_stages - 1] == req.rank()) {
        absl::Status outputs = CheckInferenceOutputs(job, req);
        if (!outputs.ok()) {
          EndLocked(job, v1::JOB_STATE_FAILED,
                    absl::StrCat("rank ", req.rank(), " (worker ", req.worker_id(),
                                 ") returned unusable inference outputs: ", outputs.message()));
          break;
        }
        job.inference_replica_outputs[req.replica()] = req.inference_outputs();
        if (static_cast<int>(job.inference_replica_outputs.size()) == job.plan.replicas) {
          std::vector<v1::TensorData> parts;
          for (auto& [replica, out] : job.inference_replica_outputs) parts.push_back(out);
          job.inference_replica_outputs.clear();
          absl::StatusOr<v1::TensorData> joined = rpc::ConcatRows(parts, "inference_outputs");
          if (!joined.ok()) {
            EndLocked(job, v1::JOB_STATE_FAILED, std::string(joined.status().message()));
            break;
          }
          job.inference_outputs = *std::move(joined);
        }
      }
      MaybeSucceedLocked(job);
      break;
    }
    case v1::TASK_OUTCOME_FAILED:
    case v1::TASK_OUTCOME_STOPPED: {
      // A rank that stops on its own (not asked to) is a failure too.
      const ReportedFailure reported{req.rank(), req.worker_id(),
                                     req.error().empty() ? "task stopped" : req.error(),
                                     req.replica()};
      spdlog::warn("{} rank {} on {} failed: {}", job.id, req.rank(), req.worker_id(),
                   reported.error);
      InvestigateLocked(job, reported, -1);
      break;
    }
    default:
      return absl::InvalidArgumentError("outcome: required");
  }
  deps_.hooks->ScheduleLocked();
  return absl::OkStatus();
}

void JobLifecycle::MaybeSucceedLocked(Job& job) {
  if (IsFinal(job.state) || job.state == v1::JOB_STATE_RESTARTING || job.ranks.empty() ||
      job.manifests_in_flight > 0) {
    return;
  }
  const bool all = std::all_of(job.ranks.begin(), job.ranks.end(), [](const RankSlot& s) {
    // A replica that left the job (its replicas carry on) owes no end.
    return s.replica_lost || (s.task_ended && s.outcome == v1::TASK_OUTCOME_SUCCEEDED);
  });
  if (all) {
    EndLocked(job, v1::JOB_STATE_SUCCEEDED, absl::StrCat("all ", job.steps_done(), " steps done"));
  }
}

bool JobLifecycle::PeersToProbe(const std::string& job_id, int attempt, int rank, int replica,
                                std::vector<Peer>* peers) {
  absl::MutexLock lock(&deps_.table->mu());
  Job* job = deps_.table->FindLocked(job_id);
  if (job == nullptr || job->attempt != attempt || IsFinal(job->state) ||
      job->state == v1::JOB_STATE_RESTARTING) {
    return false;
  }
  for (const RankSlot& slot : job->ranks) {
    if ((slot.rank != rank || slot.replica != replica) && !slot.task_ended) {
      peers->push_back(Peer{slot.rank, slot.worker_id, slot.worker_address, slot.replica});
    }
  }
  return true;
}

void JobLifecycle::InvestigateLocked(const Job& job, const ReportedFailure& reported, int epoch) {
  deps_.executor->Run(scope_.Wrap([this, job_id = job.id, attempt = job.attempt, reported, epoch] {
    std::vector<Peer> peers;
    if (!PeersToProbe(job_id, attempt, reported.rank, reported.replica, &peers)) return;
    const RootCause cause = investigation_.Investigate(reported, peers);
    absl::MutexLock lock(&deps_.table->mu());
    ApplyRootCauseLocked(job_id, attempt, epoch, cause);
  }));
}

void JobLifecycle::ApplyRootCauseLocked(const std::string& job_id, int attempt, int epoch,
                                        const RootCause& cause) {
  for (const auto& [worker_id, why] : cause.lost) deps_.registry->MarkLost(worker_id, why);
  Job* job = deps_.table->FindLocked(job_id);
  if (job == nullptr || job->attempt != attempt || IsFinal(job->state) ||
      job->state == v1::JOB_STATE_RESTARTING) {
    return;
  }
  if (epoch >= 0 && job->replica_health.epoch() != epoch) return;  // explained by a loss since
  std::set<int> lost_replicas;
  for (const auto& [worker_id, why] : cause.lost) {
    for (const RankSlot& slot : job->ranks) {
      if (slot.worker_id == worker_id) lost_replicas.insert(slot.replica);
    }
  }
  if (lost_replicas.empty()) {
    // The reporting rank's own failure: ignored when its replica has already left the job.
    if (job->replica_health.IsLost(cause.failure.replica())) return;
    FailOrRestartLocked(*job, cause.failure, cause.reason);
  } else {
    LoseReplicasOrFailLocked(*job, lost_replicas, cause.failure, cause.reason);
  }
  deps_.hooks->ScheduleLocked();
}

}  // namespace stagecoach::coordinator
