#include "coordinator/control/step_control.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "coordinator/checkpoints/checkpoint_manifest.h"

namespace stagecoach::coordinator {
namespace {

absl::Status NotInState(const Job& job, absl::string_view what, absl::string_view needed) {
  return absl::FailedPreconditionError(absl::StrCat("job ", job.id, " is ", JobStateName(job.state),
                                                    "; ", what, " needs a ", needed, " job"));
}

// How often a pause or an on-demand checkpoint asks for a later step when a rank has already
// passed the one asked for.
constexpr int kTries = 5;

}  // namespace

v1::ControlTaskRequest ControlRequest(const Job& job, int64_t step_limit) {
  v1::ControlTaskRequest request;
  request.set_job_id(job.id);
  request.set_attempt(job.attempt);
  request.set_step_limit(step_limit);
  return request;
}

std::vector<std::pair<int, std::string>> RankAddresses(const Job& job) {
  std::vector<std::pair<int, std::string>> out;
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    // A replica that left the job (its replicas carry on) is no longer steered.
    if (job.ranks[i].replica_lost) continue;
    out.emplace_back(static_cast<int>(i), job.ranks[i].worker_address);  // by task index
  }
  return out;
}

StepControl::StepControl(StepControlOptions options, StepControlDeps deps)
    : options_(options), deps_(deps) {}

StepControl::~StepControl() { scope_.Close(); }

void StepControl::ShutdownLocked() { stopping_ = true; }

absl::StatusOr<std::shared_ptr<absl::Mutex>> StepControl::ControlLock(const std::string& job_id) {
  absl::MutexLock lock(&deps_.table->mu());
  ASSIGN_OR_RETURN(Job * job, deps_.table->FindOrErrorLocked(job_id));
  return job->control_mu;
}

absl::Status StepControl::CallControl(const std::vector<std::pair<int, std::string>>& ranks,
                                      const std::vector<v1::ControlTaskRequest>& requests,
                                      int* failed_rank) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    auto answered = deps_.workers->ControlTask(ranks[i].second, requests.at(ranks[i].first),
                                               options_.worker_rpc_timeout);
    if (!answered.ok()) {
      *failed_rank = ranks[i].first;
      return absl::Status(answered.status().code(),
                          absl::StrCat("rank ", ranks[i].first, ": ", answered.status().message()));
    }
  }
  return absl::OkStatus();
}

void StepControl::SendControlLocked(Job& job, std::vector<v1::ControlTaskRequest> requests) {
  for (size_t r = 0; r < requests.size() && r < job.ranks.size(); ++r) {
    const RankSlot& slot = job.ranks[r];
    if (slot.replica_lost) continue;
    deps_.executor->Run(scope_.Wrap([this, job_id = job.id, attempt = job.attempt, rank = slot.rank,
                                     worker_id = slot.worker_id, address = slot.worker_address,
                                     request = std::move(requests[r])] {
      auto answered = deps_.workers->ControlTask(address, request, options_.worker_rpc_timeout);
      if (answered.ok()) return;
      absl::MutexLock lock(&deps_.table->mu());
      Job* job = deps_.table->FindLocked(job_id);
      if (job == nullptr || job->attempt != attempt || IsFinal(job->state)) return;
      deps_.lifecycle->ControlFailedLocked(
          *job, rank, answered.status(),
          absl::StrCat("rank ", rank, " (worker ", worker_id, ") could not be steered"));
    }));
  }
}

void StepControl::AfterProgressLocked(Job& job) {
  MaybePauseLocked(job);
  MaybeFinishLocked(job);
}

void StepControl::MaybePauseLocked(Job& job) {
  if (job.state != v1::JOB_STATE_RUNNING || job.pausing || job.hold_step < 0 ||
      job.global_done() < job.hold_step) {
    return;
  }
  absl::Status moved = job.TransitionTo(v1::JOB_STATE_PAUSED,
                                        absl::StrCat("holding after global step ", job.hold_step),
                                        deps_.clock->Now());
  if (!moved.ok()) spdlog::error("{}: {}", job.id, moved.message());
  deps_.table->PersistLocked(job);
}

void StepControl::MaybeFinishLocked(Job& job) {
  if (job.state != v1::JOB_STATE_RUNNING || job.pausing || job.finishing ||
      job.global_done() != job.finish_step ||
      (job.hold_step >= 0 && job.hold_step <= job.finish_step)) {
    return;
  }
  job.finishing = true;
  std::vector<v1::ControlTaskRequest> requests(job.ranks.size(),
                                               ControlRequest(job, job.finish_step));
  for (auto& r : requests) r.set_finish_at_limit(true);
  SendControlLocked(job, std::move(requests));
}

absl::StatusOr<v1::PauseJobResponse> StepControl::Pause(const std::string& job_id,
                                                        const std::function<bool()>& caller_gone) {
  ASSIGN_OR_RETURN(std::shared_ptr<absl::Mutex> control_mu, ControlLock(job_id));
  absl::MutexLock control(control_mu.get());
  const auto gone = [&] { return caller_gone && caller_gone(); };
  if (gone()) {
    return absl::CancelledError(absl::StrCat(
        "pausing ", job_id, ": the client went away before the pause was sent; nothing changed"));
  }
  std::vector<std::pair<int, std::string>> ranks;
  int attempt = 0;
  int64_t boundary = 0, finish = 0;
  v1::PauseJobResponse response;
  {
    absl::MutexLock lock(&deps_.table->mu());
    ASSIGN_OR_RETURN(Job * job, deps_.table->FindOrErrorLocked(job_id));
    if (job->state == v1::JOB_STATE_PAUSED ||
        (job->state == v1::JOB_STATE_RUNNING && job->hold_step >= 0)) {
      response.set_global_step(job->hold_step);
      job->ToProto(response.mutable_job(), HistoryWindow::Summary());
      return response;
    }
    if (job->state != v1::JOB_STATE_RUNNING) return NotInState(*job, "pausing", "RUNNING");
    if (job->finishing) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " has done all its steps and is finishing"));
    }
    int64_t furthest = 0;
    for (const RankSlot& slot : job->ranks) furthest = std::max(furthest, slot.steps_done);
    // The earliest boundary no rank has passed: ranks at `furthest` are inside the next step.
    finish = job->finish_step;
    boundary = std::min(job->attempt_base + furthest + 1, finish);
    if (job->global_done() == finish) boundary = finish;
    job->pausing = true;
    ranks = RankAddresses(*job);
    attempt = job->attempt;
  }
  absl::Status failure;
  int failed_rank = -1;
  for (int tried = 0; tried < kTries; ++tried) {
    std::vector<v1::ControlTaskRequest> requests(ranks.size());
    for (v1::ControlTaskRequest& request : requests) {
      request.set_job_id(job_id);
      request.set_attempt(attempt);
      request.set_step_limit(boundary);
    }
    failure = CallControl(ranks, requests, &failed_rank);
    // A rank already inside the step after `boundary` refuses it: pause one step later.
    if (failure.ok() || !absl::IsFailedPrecondition(failure) || boundary >= finish) break;
    ++boundary;
  }
  absl::MutexLock lock(&deps_.table->mu());
  ASSIGN_OR_RETURN(Job * job, deps_.table->FindOrErrorLocked(job_id));
  job->pausing = false;
  if (job->attempt != attempt || job->state != v1::JOB_STATE_RUNNING) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " became ", JobStateName(job->state),
                                           " while it was being paused: ", job->reason));
  }
  if (failure.ok() && gone()) {
    // Its caller was told it failed (or gave up): the ranks run on as before.
    SendControlLocked(*job, std::vector<v1::ControlTaskRequest>(
                                job->ranks.size(), ControlRequest(*job, job->finish_step)));
    MaybeFinishLocked(*job);
    spdlog::warn("{}: pause at global step {} withdrawn: its client went away", job_id, boundary);
    return absl::CancelledError(absl::StrCat("pausing ", job_id,
                                             ": the client went away before the ranks answered; "
                                             "the pause was withdrawn and the job runs on"));
  }
  if (!failure.ok()) {
    if (absl::IsFailedPrecondition(failure)) {
      // Ranks that took a lower limit run on to the end again.
      SendControlLocked(*job, std::vector<v1::ControlTaskRequest>(
                                  job->ranks.size(), ControlRequest(*job, job->finish_step)));
      MaybeFinishLocked(*job);
      return absl::AbortedError(
          absl::StrCat("job ", job_id, ": no step boundary to pause at (", failure.message(), ")"));
    }
    deps_.lifecycle->ControlFailedLocked(*job, failed_rank, failure,
                                         absl::StrCat("pausing ", job_id));
    return failure;
  }
  job->hold_step = boundary;
  spdlog::info("{}: pausing after global step {}", job_id, boundary);
  MaybePauseLocked(*job);
  deps_.table->PersistLocked(*job);
  response.set_global_step(boundary);
  job->ToProto(response.mutable_job(), HistoryWindow::Summary());
  return response;
}

absl::StatusOr<v1::Job> StepControl::Resume(const std::string& job_id) {
  ASSIGN_OR_RETURN(std::shared_ptr<absl::Mutex> control_mu, ControlLock(job_id));
  absl::MutexLock control(control_mu.get());
  std::vector<std::pair<int, std::string>> ranks;
  std::vector<v1::ControlTaskRequest> requests;
  int attempt = 0;
  {
    absl::MutexLock lock(&deps_.table->mu());
    ASSIGN_OR_RETURN(Job * job, deps_.table->FindOrErrorLocked(job_id));
    if (job->state != v1::JOB_STATE_PAUSED) return NotInState(*job, "resuming", "PAUSED");
    ranks = RankAddresses(*job);
    attempt = job->attempt;
    requests.assign(ranks.size(), ControlRequest(*job, job->finish_step));
  }
  int failed_rank = -1;
  const absl::Status sent = CallControl(ranks, requests, &failed_rank);
  absl::MutexLock lock(&deps_.table->mu());
  ASSIGN_OR_RETURN(Job * job, deps_.table->FindOrErrorLocked(job_id));
  if (job->attempt != attempt || job->state != v1::JOB_STATE_PAUSED) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " became ", JobStateName(job->state),
                                           " while it was being resumed: ", job->reason));
  }
  if (!sent.ok()) {
    deps_.lifecycle->ControlFailedLocked(*job, failed_rank, sent,
                                         absl::StrCat("resuming ", job_id));
    return sent;
  }
  job->hold_step = -1;
  RETURN_IF_ERROR(
      job->TransitionTo(v1::JOB_STATE_RUNNING, "resumed by client", deps_.clock->Now()));
  deps_.table->PersistLocked(*job);
  MaybeFinishLocked(*job);
  v1::Job out;
  job->ToProto(&out, HistoryWindow::Summary());
  return out;
}

absl::StatusOr<v1::RunStepsResponse> StepControl::RunSteps(const std::string& job_id,
                                                           int64_t steps) {
  if (steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("steps: must be >= 1, got ", steps));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<absl::Mutex> control_mu, ControlLock(job_id));
  absl::MutexLock control(control_mu.get());
  std::vector<std::pair<int, std::string>> ranks;
  std::vector<v1::ControlTaskRequest> requests;
  int attempt = 0;
  int64_t until = 0;
  bool was_paused = false;
  {
    absl::MutexLock lock(&deps_.table->mu());
    ASSIGN_OR_RETURN(Job * job, deps_.table->FindOrErrorLocked(job_id));
    if (job->state == v1::JOB_STATE_PAUSED) {
      was_paused = true;
      until = job->global_done() + steps;
      job->hold_step = until;
    } else if (job->state == v1::JOB_STATE_RUNNING) {
      if (job->finishing) {
        return absl::FailedPreconditionError(
            absl::StrCat("job ", job_id,
                         " has done all its steps and is finishing; to train on, submit a "
                         "job with training.resume_from its final checkpoint"));
      }
      if (job->pausing) {
        return absl::FailedPreconditionError(
            absl::StrCat("job ", job_id, " is being paused; retry once it is PAUSED"));
      }
      until = job->hold_step >= 0 ? job->hold_step : job->finish_step + steps;
    } else {
      return NotInState(*job, "running more steps", "RUNNING or PAUSED");
    }
    // The job's end moves when the new steps go past it, and with it its final checkpoint.
    const int64_t new_finish =
        was_paused ? std::max(job->finish_step, until) : job->finish_step + steps;
    const bool extended = new_finish != job->finish_step;
    job->finish_step = new_finish;
    ranks = RankAddresses(*job);
    attempt = job->attempt;
    v1::ControlTaskRequest request =
        ControlRequest(*job, job->hold_step >= 0 ? job->hold_step : job->finish_step);
    if (extended && !job->forward_only() && !job->spec.training.checkpoint.dir.empty()) {
      request.add_checkpoint_steps(job->finish_step);
    }
    requests.assign(ranks.size(), request);
    deps_.table->PersistLocked(*job);
  }
  int failed_rank = -1;
  const absl::Status sent = CallControl(ranks, requests, &failed_rank);
  absl::MutexLock lock(&deps_.table->mu());
  ASSIGN_OR_RETURN(Job * job, deps_.table->FindOrErrorLocked(job_id));
  if (job->attempt != attempt || IsFinal(job->state) || job->state == v1::JOB_STATE_RESTARTING) {
    return absl::AbortedError(
        absl::StrCat("job ", job_id, " became ", JobStateName(job->state), ": ", job->reason));
  }
  if (!sent.ok()) {
    deps_.lifecycle->ControlFailedLocked(*job, failed_rank, sent, absl::StrCat("running ", job_id));
    return sent;
  }
  if (was_paused) {
    RETURN_IF_ERROR(job->TransitionTo(
        v1::JOB_STATE_RUNNING,
        absl::StrCat("running ", steps, " more steps (until global step ", until, ")"),
        deps_.clock->Now()));
  }
  MaybePauseLocked(*job);
  MaybeFinishLocked(*job);
  deps_.table->PersistLocked(*job);
  v1::RunStepsResponse response;
  response.set_until_global_step(until);
  job->ToProto(response.mutable_job(), HistoryWindow::Summary());
  return response;
}

absl::StatusOr<v1::CheckpointJobResponse> StepControl::Checkpoint(const std::string& job_id) {
  bool paused = false;
  {
    absl::MutexLock lock(&deps_.table->mu());
    ASSIGN_OR_RETURN(Job * job, deps_.table->FindOrErrorLocked(job_id));
    paused = job->state == v1::JOB_STATE_PAUSED;
  }
  // A paused job writes the state it holds.
  return paused ? CheckpointPaused(job_id) : CheckpointRunning(job_id);
}

absl::StatusOr<v1::CheckpointJobResponse> StepControl::CheckpointRunning(
    const std::string& job_id) {
  ASSIGN_OR_RETURN(std::shared_ptr<absl::Mutex> control_mu, ControlLock(job_id));
  absl::MutexLock control(control_mu.get());
  std::vector<std::pair<int, std::string>> ranks;
  v1::CheckpointJobResponse response;
  int64_t last = 0;  // the job's final global step
  std::string dir;
  {
    absl::MutexLock lock(&deps_.table->mu());
    ASSIGN_OR_RETURN(Job * job, deps_.table->FindOrErrorLocked(job_id));
    if (job->state != v1::JOB_STATE_RUNNING) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " is ", JobStateName(job->state),
                       "; only a RUNNING or PAUSED job checkpoints"));
    }
    if (job->forward_only()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " is forward-only; it has no training state to save"));
    }
    dir = job->spec.training.checkpoint.dir;
    if (dir.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, ": its spec has no training.checkpoint.dir"));
    }
    int64_t furthest = 0;
    for (const RankSlot& slot : job->ranks) furthest = std::max(furthest, slot.steps_done);
    // Step `furthest` (from 0) is the earliest no rank has finished; after it the timeline holds
    // base + furthest + 1 steps.
    response.set_step(job->attempt_base + furthest + 1);
    last = job->finish_step;
    ranks = RankAddresses(*job);
  }
  absl::Status failure;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    if (response.step() >= last) {
      // The end-of-job checkpoint is written anyway.
      response.set_step(last);
      response.set_directory(CheckpointStepDirectory(dir, last));
      return response;
    }
    failure = absl::OkStatus();
    for (const auto& [rank, address] : ranks) {
      absl::Status asked = deps_.workers->RequestCheckpoint(address, job_id, response.step(),
                                                            options_.worker_rpc_timeout);
      if (!asked.ok()) {
        failure = absl::Status(asked.code(),
                               absl::StrCat("job ", job_id, " rank ", rank, ": ", asked.message()));
        break;
      }
    }
    if (failure.ok()) {
      response.set_directory(CheckpointStepDirectory(dir, response.step()));
      spdlog::info("{}: checkpoint requested after step {} in {}", job_id, response.step(),
                   response.directory());
      return response;
    }
    if (!absl::IsFailedPrecondition(failure)) return failure;
    // A rank has already passed that step: ask for the next one.
    response.set_step(response.step() + 1);
  }
  return absl::AbortedError(absl::StrCat("checkpoint of ", failure.message(), " (asked ", kTries,
                                         " times for later steps)"));
}

absl::StatusOr<v1::CheckpointJobResponse> StepControl::CheckpointPaused(const std::string& job_id) {
  ASSIGN_OR_RETURN(std::shared_ptr<absl::Mutex> control_mu, ControlLock(job_id));
  absl::MutexLock control(control_mu.get());
  std::vector<std::pair<int, std::string>> ranks;
  std::vector<v1::ControlTaskRequest> requests;
  v1::CheckpointJobResponse response;
  int attempt = 0;
  {
    absl::MutexLock lock(&deps_.table->mu());
    ASSIGN_OR_RETURN(Job * job, deps_.table->FindOrErrorLocked(job_id));
    if (job->state != v1::JOB_STATE_PAUSED) return NotInState(*job, "checkpointing", "PAUSED");
    if (job->forward_only() || job->spec.training.checkpoint.dir.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id,
                       job->forward_only() ? " is forward-only; it has no training state to save"
                                           : ": its spec has no training.checkpoint.dir"));
    }
    const int64_t step = job->global_done();
    response.set_step(step);
    response.set_directory(CheckpointStepDirectory(job->spec.training.checkpoint.dir, step));
    for (const v1::JobCheckpoint& c : job->checkpoints) {
      if (c.step() == step) return response;  // already written there
    }
    // The ranks stay where they hold and write the checkpoint of that position.
    v1::ControlTaskRequest request = ControlRequest(*job, job->hold_step);
    request.add_checkpoint_steps(step);
    ranks = RankAddresses(*job);
    requests.assign(ranks.size(), request);
    attempt = job->attempt;
  }
  int failed_rank = -1;
  const absl::Status sent = CallControl(ranks, requests, &failed_rank);
  if (!sent.ok()) {
    absl::MutexLock lock(&deps_.table->mu());
    Job* job = deps_.table->FindLocked(job_id);
    if (job != nullptr && job->attempt == attempt && !IsFinal(job->state) &&
        !absl::IsFailedPrecondition(sent)) {
      deps_.lifecycle->ControlFailedLocked(*job, failed_rank, sent,
                                           absl::StrCat("checkpointing ", job_id));
    }
    return sent;
  }
  spdlog::info("{}: checkpoint of the paused job at step {} requested in {}", job_id,
               response.step(), response.directory());
  return response;
}

}  // namespace stagecoach::coordinator
