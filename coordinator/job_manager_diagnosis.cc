// JobManager's part of diagnosing running jobs (coordinator/diagnosis/): beacons from
// heartbeats, the stall rule on each tick, and DiagnoseJob.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "coordinator/job_manager.h"

namespace stagecoach::coordinator {
namespace {

// The work of each task's rank, for the straggler rule's peers: per stage it holds, its layers,
// parameters and whether it is the first or the last stage (task order, replica by replica).
std::vector<std::string> WorkKeys(const Plan& plan) {
  std::vector<std::string> by_rank(plan.num_ranks);
  for (const StagePlan& stage : plan.stages) {
    const int rank = stage.stage < static_cast<int>(plan.stage_to_rank.size())
                         ? plan.stage_to_rank[stage.stage]
                         : -1;
    if (rank < 0 || rank >= plan.num_ranks) continue;
    absl::StrAppend(&by_rank[rank], "[", stage.end_layer - stage.first_layer, " layers ",
                    stage.parameters, " parameters", stage.stage == 0 ? " first" : "",
                    stage.stage == plan.num_stages - 1 ? " last" : "", "]");
  }
  std::vector<std::string> keys;
  keys.reserve(plan.num_tasks());
  for (int replica = 0; replica < plan.replicas; ++replica) {
    keys.insert(keys.end(), by_rank.begin(), by_rank.end());
  }
  return keys;
}

}  // namespace

void JobManager::EnsureDiagnosisLocked(Job& job) {
  if (job.diagnosis.attempt() == job.attempt || job.ranks.empty()) return;
  job.diagnosis.StartAttempt(job.attempt, WorkKeys(job.plan), job.plan.num_ranks,
                             options_.stragglers);
}

void JobManager::TakeProgressLocked() {
  for (ProgressInbox::Posted& p : progress_inbox_.Take()) {
    const v1::RankProgress& progress = p.progress;
    Job* job = table_.FindLocked(progress.job_id());
    if (job == nullptr || IsFinal(job->state)) continue;
    EnsureDiagnosisLocked(*job);
    const int task = job->plan.TaskIndex(progress.replica(), progress.rank());
    if (progress.rank() < 0 || progress.rank() >= job->plan.num_ranks || task < 0 ||
        task >= static_cast<int>(job->ranks.size()) || job->ranks[task].worker_id != p.worker_id) {
      continue;  // not this attempt's placement (a stale task still winding down)
    }
    job->diagnosis.Record(task, progress, p.received);
  }
}

StallInputs JobManager::StallInputsLocked(const Job& job, bool heartbeats) const {
  StallInputs in;
  in.step = job.global_done();
  in.step_began = job.diagnosis.step_began();
  in.ranks.reserve(job.ranks.size());
  for (size_t task = 0; task < job.ranks.size(); ++task) {
    const RankSlot& slot = job.ranks[task];
    RankView view;
    view.rank = slot.rank;
    view.replica = slot.replica;
    view.worker_id = slot.worker_id;
    view.address = slot.worker_address;
    const std::optional<v1::RankProgress>& progress =
        job.diagnosis.progress(static_cast<int>(task));
    view.progress = progress.has_value() ? &*progress : nullptr;
    view.received = job.diagnosis.received(static_cast<int>(task));
    if (heartbeats) view.last_heartbeat = registry_.LastHeartbeat(slot.worker_id);
    in.ranks.push_back(std::move(view));
  }
  return in;
}

void JobManager::DiagnoseJobsLocked(absl::Time now) {
  TakeProgressLocked();
  for (Job* job : table_.AllLocked()) {
    if (IsFinal(job->state) && !job->diagnosis.stall().has_value()) continue;
    EnsureDiagnosisLocked(*job);
    const bool running = job->state == v1::JOB_STATE_RUNNING && !job->ranks.empty();
    job->diagnosis.SetRunning(running, now);
    std::optional<v1::JobStall> stall;
    // The rule itself is cheap (a pass over the beacons); only a stalled job's ranks are
    // described, on every tick while it stays stalled (GetJob shows the latest).
    if (running && job->diagnosis.step_began() != absl::InfinitePast()) {
      const std::vector<absl::Duration> recent(job->diagnosis.recent_steps().begin(),
                                               job->diagnosis.recent_steps().end());
      const absl::Duration bound = StallBound(options_.stall, recent);
      const std::optional<absl::Duration> ran =
          StepRunning(StallInputsLocked(*job, false), options_.stall, now);
      if (ran.has_value() && *ran > bound) {
        stall = EvaluateStall(StallInputsLocked(*job, true), bound, options_.stall, now);
      }
    }
    std::optional<v1::JobEvent> event = job->diagnosis.SetStall(std::move(stall), now);
    if (!event.has_value()) continue;
    if (event->has_stalled()) {
      const v1::JobStall& s = event->stalled().stall();
      spdlog::warn("{}: STALLED: step {} has run {:.1f} s (bound {:.1f} s)", job->id,
                   s.global_step(), absl::ToDoubleSeconds(rpc::FromProtoDuration(s.running())),
                   absl::ToDoubleSeconds(rpc::FromProtoDuration(s.bound())));
      for (const v1::RankDiagnosis& r : s.ranks()) {
        spdlog::warn("{}:   replica {} rank {}: {}", job->id, r.replica(), r.rank(), r.summary());
      }
    } else {
      spdlog::info(
          "{}: no longer stalled: step {} ran {:.1f} s", job->id,
          event->stall_ended().stall().global_step(),
          absl::ToDoubleSeconds(rpc::FromProtoDuration(event->stall_ended().stall().running())));
    }
    job->AddEvent(*std::move(event), now);
    if (deps_.metrics != nullptr) {
      deps_.metrics->Diagnosis(job->id, job->diagnosis.stall().has_value(),
                               job->diagnosis.stragglers().Pace());
    }
  }
}

absl::StatusOr<v1::DiagnoseJobResponse> JobManager::DiagnoseJob(const std::string& job_id) {
  const absl::Time now = deps_.clock->Now();
  absl::MutexLock lock(&table_.mu());
  TakeProgressLocked();
  ASSIGN_OR_RETURN(Job * job, table_.FindOrErrorLocked(job_id));
  v1::DiagnoseJobResponse out;
  out.set_job_id(job->id);
  out.set_state(job->state);
  out.set_attempt(job->attempt);
  out.set_global_steps_done(job->global_done());
  const std::vector<absl::Duration> recent(job->diagnosis.recent_steps().begin(),
                                           job->diagnosis.recent_steps().end());
  *out.mutable_stall_bound() = rpc::ToProtoDuration(StallBound(options_.stall, recent));
  *out.mutable_median_step() = rpc::ToProtoDuration(MedianDuration(recent));
  if (IsFinal(job->state)) return out;  // its ranks are gone
  EnsureDiagnosisLocked(*job);
  for (v1::RankDiagnosis& d :
       DiagnoseRanks(StallInputsLocked(*job, true).ranks, options_.stall, now)) {
    *out.add_ranks() = std::move(d);
  }
  v1::Job view;
  job->DiagnosisToProto(&view);
  if (view.has_stall()) *out.mutable_stall() = view.stall();
  *out.mutable_stragglers() = view.stragglers();
  *out.mutable_pace() = view.pace();
  return out;
}

}  // namespace stagecoach::coordinator
