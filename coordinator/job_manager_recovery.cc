// JobManager's part for the job table on disk: reloading it after a coordinator restart
// (job_manager.h: Recover), with each unfinished job planned again in the background
// (coordinator/lifecycle/recovery.h).
#include "absl/strings/str_cat.h"
#include "common/util/logging.h"
#include "coordinator/job_manager.h"
#include "coordinator/lifecycle/recovery.h"

namespace stagecoach::coordinator {

// --- The job table on disk ---

std::vector<std::string> JobManager::Recover() {
  std::vector<std::string> problems;
  if (deps_.store == nullptr) return problems;
  // Records are read and rebuilt before the lock is taken; nothing is planned or verified here,
  // so the coordinator answers at once.
  std::vector<RebuiltJob> rebuilt;
  for (const v1::Job& record : deps_.store->LoadAll(&problems)) {
    absl::StatusOr<RebuiltJob> job = RebuildJob(record);
    if (job.ok()) {
      rebuilt.push_back(*std::move(job));
    } else {
      problems.push_back(std::string(job.status().message()));
    }
  }
  absl::MutexLock lock(&table_.mu());
  const absl::Time now = deps_.clock->Now();
  for (RebuiltJob& r : rebuilt) {
    Job& job = *r.job;
    if (absl::Status added = table_.InsertLocked(r.job); !added.ok()) {
      problems.push_back(std::string(added.message()));
      continue;
    }
    if (!r.recovering) continue;
    if (job.state != v1::JOB_STATE_PENDING) {
      if (job.state != v1::JOB_STATE_RESTARTING) {
        if (absl::Status moved =
                job.TransitionTo(v1::JOB_STATE_RESTARTING, "the coordinator restarted", now);
            !moved.ok()) {
          problems.push_back(absl::StrCat(job.id, ": ", moved.message()));
        }
      }
      job.reason = "the coordinator restarted; planning it again and checking its checkpoint";
      table_.PersistLocked(job);
    }
    QueueRecoveryLocked(job);
  }
  spdlog::info("job table: {} jobs loaded from {}", table_.SizeLocked(), deps_.store->Describe());
  return problems;
}

void JobManager::QueueRecoveryLocked(Job& job) {
  deps_.executor->Run(scope_.Wrap([this, input = RecoveryInput::Of(job)] {
    RecoveredState state = PrepareRecovery(input);
    for (const std::string& problem : state.problems) spdlog::error("job table: {}", problem);
    absl::MutexLock lock(&table_.mu());
    Job* job = table_.FindLocked(input.job_id);
    if (job == nullptr || !job->recovering || IsFinal(job->state)) return;
    const std::string plan_error =
        state.plan.ok() ? "" : std::string(state.plan.status().message());
    ApplyRecovery(*job, std::move(state));
    FinishRecoveryLocked(*job, plan_error);
    ScheduleLocked();
  }));
}

void JobManager::FinishRecoveryLocked(Job& job, const std::string& plan_error) {
  if (!plan_error.empty()) {
    lifecycle_.EndLocked(
        job, v1::JOB_STATE_FAILED,
        absl::StrCat("cannot plan it again after the coordinator restarted: ", plan_error));
    return;
  }
  if (job.inference) {
    lifecycle_.EndLocked(job, v1::JOB_STATE_FAILED,
                         "the coordinator restarted while the inference ran; its client's "
                         "batch was not kept");
    return;
  }
  if (job.state == v1::JOB_STATE_PENDING) return;
  // It was placed: it continues from its latest checkpoint on the workers that register.
  job.reason =
      absl::StrCat("the coordinator restarted; continuing from ",
                   job.checkpoints.empty()
                       ? std::string(job.resumed_from.has_value() ? "the checkpoint it resumed from"
                                                                  : "its initial parameters")
                       : absl::StrCat("the checkpoint after step ", job.checkpoints.back().step()),
                   " once workers register");
  table_.PersistLocked(job);
  spdlog::info("{} recovered: {}", job.id, job.reason);
}

}  // namespace stagecoach::coordinator
