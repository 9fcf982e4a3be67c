#include "coordinator/diagnosis/job_diagnosis.h"

#include <utility>

#include "common/rpc/time_conversion.h"

namespace stagecoach::coordinator {

void JobDiagnosis::StartAttempt(int attempt, std::vector<std::string> work_keys, int num_ranks,
                                const StragglerOptions& stragglers) {
  attempt_ = attempt;
  const size_t tasks = work_keys.size();
  progress_.assign(tasks, std::nullopt);
  received_.assign(tasks, absl::InfinitePast());
  stragglers_ = StragglerWatch(stragglers, std::move(work_keys), num_ranks);
}

void JobDiagnosis::Record(int task, const v1::RankProgress& progress, absl::Time now) {
  if (progress.attempt() != attempt_ || task < 0 || task >= static_cast<int>(progress_.size())) {
    return;
  }
  progress_[task] = progress;
  received_[task] = now;
}

const std::optional<v1::RankProgress>& JobDiagnosis::progress(int task) const {
  static const std::optional<v1::RankProgress> kNone;
  return task >= 0 && task < static_cast<int>(progress_.size()) ? progress_[task] : kNone;
}

absl::Time JobDiagnosis::received(int task) const {
  return task >= 0 && task < static_cast<int>(received_.size()) ? received_[task]
                                                                : absl::InfinitePast();
}

void JobDiagnosis::SetRunning(bool running, absl::Time now) {
  if (running == running_) return;
  running_ = running;
  step_began_ = running ? now : absl::InfinitePast();
}

void JobDiagnosis::StepCompleted(absl::Time now) {
  if (!running_) return;
  if (step_began_ != absl::InfinitePast()) {
    recent_.push_back(now - step_began_);
    while (static_cast<int>(recent_.size()) > kRecentSteps) recent_.pop_front();
  }
  step_began_ = now;
}

std::optional<v1::JobEvent> JobDiagnosis::SetStall(std::optional<v1::JobStall> stall,
                                                   absl::Time now) {
  std::optional<v1::JobEvent> event;
  if (stall.has_value() && !stall_.has_value()) {
    event.emplace();
    *event->mutable_stalled()->mutable_stall() = *stall;
  } else if (!stall.has_value() && stall_.has_value()) {
    event.emplace();
    v1::JobStall ended = *std::move(stall_);
    // How long the stalled step ran in the end: from when it passed its bound to now.
    const absl::Duration running =
        rpc::FromProtoDuration(ended.bound()) + (now - rpc::FromProtoTimestamp(ended.since()));
    *ended.mutable_running() = rpc::ToProtoDuration(running);
    *event->mutable_stall_ended()->mutable_stall() = std::move(ended);
  }
  stall_ = std::move(stall);
  return event;
}

}  // namespace stagecoach::coordinator
