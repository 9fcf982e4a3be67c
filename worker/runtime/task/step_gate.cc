#include "worker/runtime/task/step_gate.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {

StepGate::StepGate(StepGateOptions options) : options_(std::move(options)) {
  absl::MutexLock lock(&mu_);
  steps_done_ = options_.steps_done;
  step_limit_ = options_.step_limit;
  finish_at_limit_ = options_.finish_at_limit;
  checkpoint_steps_.insert(options_.checkpoint_steps.begin(), options_.checkpoint_steps.end());
}

std::string StepGate::Who() const {
  return absl::StrCat(options_.job_id, " attempt ", options_.attempt, " rank ", options_.rank);
}

bool StepGate::HoldsLocked() const {
  return !executing_ && steps_done_ >= step_limit_ && !finish_at_limit_;
}

absl::StatusOr<StepGate::Decision> StepGate::Next() {
  absl::MutexLock lock(&mu_);
  in_next_ = true;
  while (true) {
    Decision decision;
    decision.steps_done = steps_done_;
    if (stop_reason_.has_value()) {
      finishing_ = true;
      in_next_ = false;
      return absl::CancelledError(absl::StrCat("stopped: ", *stop_reason_));
    }
    if (!checking_step_.has_value()) {
      bool decided = true;
      if (checkpoint_at_hold_) {
        checkpoint_at_hold_ = false;
        decision.action = Action::kCheckpointAtHold;
      } else if (pending_client_.has_value()) {
        decision.action = Action::kClientStep;
        decision.client = *std::move(pending_client_);
        pending_client_.reset();
        executing_ = true;
      } else if (steps_done_ < step_limit_) {
        decision.action = Action::kDataStep;
        executing_ = true;
      } else if (finish_at_limit_) {
        decision.action = Action::kFinish;
        finishing_ = true;
      } else {
        decided = false;
      }
      if (decided) {
        in_next_ = false;
        return decision;
      }
    }
    if (absl::Status held = HoldLocked(); !held.ok()) {
      finishing_ = true;
      in_next_ = false;
      return held;
    }
  }
}

absl::Status StepGate::HoldLocked() {
  const int64_t version = version_;
  const bool was_checking = checking_step_.has_value();
  if (!was_checking) {
    spdlog::info("{} rank {}: holding at step {} (step limit {})", options_.job_id, options_.rank,
                 steps_done_, step_limit_);
    holding_ = true;
  }
  // Waiting for a check to end, any end will do; a hold waits for an Apply that took effect.
  auto moved = [this, version, was_checking]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_reason_.has_value() ||
           (!checking_step_.has_value() && (was_checking || version_ != version));
  };
  const bool woke = mu_.AwaitWithTimeout(absl::Condition(&moved), options_.hold_timeout);
  holding_ = false;
  if (woke) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(
      "rank ", options_.rank, " held at step ", steps_done_, " for longer than hold_timeout (",
      absl::FormatDuration(options_.hold_timeout), ") without a ControlTask"));
}

StepGate::StepEnd StepGate::EndCountedStep() {
  absl::MutexLock lock(&mu_);
  ++steps_done_;
  executing_ = false;
  return StepEnd{steps_done_, checkpoint_steps_.count(steps_done_) > 0};
}

void StepGate::EndUncountedStep() {
  absl::MutexLock lock(&mu_);
  executing_ = false;
}

void StepGate::Finish() {
  absl::MutexLock lock(&mu_);
  finishing_ = true;
}

void StepGate::Stop(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (!stop_reason_.has_value()) stop_reason_ = reason;
  ++version_;
}

std::optional<std::string> StepGate::stop_reason() const {
  absl::MutexLock lock(&mu_);
  return stop_reason_;
}

int64_t StepGate::steps_done() const {
  absl::MutexLock lock(&mu_);
  return steps_done_;
}

void StepGate::StartAt(int64_t steps_done, int64_t step_limit, bool finish_at_limit) {
  absl::MutexLock lock(&mu_);
  steps_done_ = steps_done;
  step_limit_ = std::max(step_limit, steps_done);
  finish_at_limit_ = finish_at_limit;
}

absl::Status StepGate::RequestCheckpoint(int64_t global_step) {
  absl::MutexLock lock(&mu_);
  if (global_step <= steps_done_) {
    return absl::FailedPreconditionError(absl::StrCat(
        options_.job_id, " rank ", options_.rank, ": the task has already done ", steps_done_,
        " steps of the timeline; it cannot checkpoint after step ", global_step));
  }
  checkpoint_steps_.insert(global_step);
  return absl::OkStatus();
}

absl::Status StepGate::ValidateLocked(const Control& control, const ClientStep* client) const {
  const std::string who = Who();
  const int64_t done = steps_done_;
  if (finishing_ || stop_reason_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(who, ": the task is ending (after ", done,
                                                      " steps of the timeline) and takes no ",
                                                      "ControlTask"));
  }
  const int64_t least = executing_ ? done + 1 : done;
  if (control.step_limit < least) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": step_limit ", control.step_limit, " is below the ", least, " steps ",
        executing_ ? absl::StrCat("the task will have done at the end of the step it runs (", done,
                                  " done)")
                   : "the task has done"));
  }
  if (client == nullptr) return absl::OkStatus();
  if (pending_client_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": a client step at step ", pending_client_->global_step, " is already pending"));
  }
  if (checking_step_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": a client step at step ", *checking_step_, " is already being checked"));
  }
  const bool holding = HoldsLocked();
  if (!holding || done != client->global_step) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": client_step.global_step is ", client->global_step, ", but the task ",
        holding ? absl::StrCat("holds at step ", done)
                : absl::StrCat("does not hold (", done, " steps done, step limit ", step_limit_,
                               executing_ ? ", a step running" : "", ")")));
  }
  if (!client->forward_only && options_.forward_only_task) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": a forward-only task cannot run a training client step"));
  }
  return absl::OkStatus();
}

absl::Status StepGate::AtBoundaryLocked(int64_t step, const std::function<bool()>& may_run,
                                        const Check& work, const std::string& for_what,
                                        bool* ran) {
  *ran = false;
  checking_step_ = step;
  // The task's thread may still be finishing the previous step (its checkpoint, its report):
  // the work runs once it is back in Next, where it starts nothing until the work ends.
  auto back = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_next_ || finishing_ || stop_reason_.has_value();
  };
  absl::Status status;
  if (!mu_.AwaitWithTimeout(absl::Condition(&back), options_.check_timeout)) {
    status = absl::DeadlineExceededError(
        absl::StrCat(Who(), ": the task did not come back to its step boundary within ",
                     absl::FormatDuration(options_.check_timeout), " ", for_what));
  } else if (may_run()) {
    mu_.Unlock();
    status = work();
    mu_.Lock();
    *ran = true;
  }
  checking_step_.reset();
  return status;
}

absl::Status StepGate::CheckLocked(int64_t global_step, const Check& check) {
  const int64_t version = version_;
  bool ran = false;
  absl::Status status = AtBoundaryLocked(
      global_step,
      [this, version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return version_ == version && !finishing_;
      },
      check, absl::StrCat("to check the client step at step ", global_step), &ran);
  if (status.ok() && (version_ != version || finishing_ || stop_reason_.has_value())) {
    status = absl::FailedPreconditionError(absl::StrCat(
        Who(), ": the task moved (a ControlTask, a stop or its end) while the client step at step ",
        global_step, " was being checked; it was not taken"));
  }
  return status;
}

absl::StatusOr<int64_t> StepGate::Apply(const Control& control, std::optional<ClientStep> client,
                                        const Check& check) {
  absl::MutexLock lock(&mu_);
  const ClientStep* step = client.has_value() ? &*client : nullptr;
  RETURN_IF_ERROR(ValidateLocked(control, step));
  if (step != nullptr && check) RETURN_IF_ERROR(CheckLocked(step->global_step, check));
  const int64_t done = steps_done_;
  step_limit_ = control.step_limit;
  finish_at_limit_ = control.finish_at_limit;
  for (int64_t s : control.checkpoint_steps) {
    if (s > done) checkpoint_steps_.insert(s);
    if (s == done && !executing_) checkpoint_at_hold_ = true;
  }
  // A ControlTask without a client step withdraws one that is pending and has not started.
  pending_client_ = std::move(client);
  ++version_;
  return done;
}

absl::Status StepGate::RunHeld(const Check& work, const std::string& what) {
  absl::MutexLock lock(&mu_);
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !checking_step_.has_value() || finishing_ || stop_reason_.has_value();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&free), options_.check_timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        Who(), ": ", what, " waited longer than ", absl::FormatDuration(options_.check_timeout),
        " for the step boundary (a client step's check or another such request ran)"));
  }
  if (finishing_ || stop_reason_.has_value() || !HoldsLocked() || pending_client_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Who(), ": ", what, " needs the task to hold (its job PAUSED), but it ",
        finishing_ || stop_reason_.has_value()
            ? std::string("is ending")
            : absl::StrCat("has ", steps_done_, " steps done of its step limit ", step_limit_,
                           executing_ ? ", a step running" : "",
                           pending_client_.has_value() ? ", a client step pending" : "")));
  }
  bool ran = false;
  absl::Status status = AtBoundaryLocked(
      steps_done_,
      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !finishing_ && !stop_reason_.has_value();
      },
      work, absl::StrCat("for ", what), &ran);
  if (status.ok() && !ran) {
    status = absl::FailedPreconditionError(
        absl::StrCat(Who(), ": the task is ending; ", what, " did not run"));
  }
  return status;
}

absl::Status StepGate::AwaitHolding(int64_t steps_done, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto there = [this, steps_done]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return finishing_ || (holding_ && steps_done_ == steps_done);
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&there), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(Who(), ": not holding at step ", steps_done,
                                                    " after ", absl::FormatDuration(timeout), " (",
                                                    steps_done_, " steps done)"));
  }
  if (!(holding_ && steps_done_ == steps_done)) {
    return absl::FailedPreconditionError(absl::StrCat(
        Who(), ": the task ended at step ", steps_done_, " without holding at step ", steps_done));
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
