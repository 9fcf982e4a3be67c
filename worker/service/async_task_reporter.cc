#include "worker/service/async_task_reporter.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/logging.h"

namespace stagecoach::worker {

AsyncTaskReporter::AsyncTaskReporter(runtime::TaskReporter* next, AsyncTaskReporterOptions options)
    : next_(next), options_(options), thread_([this] { Loop(); }) {}

AsyncTaskReporter::~AsyncTaskReporter() {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + options_.timeout;
    auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return Drained(); };
    if (!mu_.AwaitWithDeadline(absl::Condition(&drained), deadline)) {
      spdlog::warn("dropping {} step reports the coordinator did not take within {}", queue_.size(),
                   absl::FormatDuration(options_.timeout));
      queue_.clear();
    }
    stopping_ = true;
  }
  thread_.join();
}

absl::Status AsyncTaskReporter::ReportStep(const v1::ReportStepRequest& report) {
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.size() < options_.max_pending;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&room), options_.timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat(queue_.size(), " earlier step reports still wait to be sent after ",
                     absl::FormatDuration(options_.timeout)));
  }
  queue_.push_back(report);
  return absl::OkStatus();
}

absl::Status AsyncTaskReporter::ReportTaskEnd(const v1::ReportTaskEndRequest& report) {
  {
    absl::MutexLock lock(&mu_);
    auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return Drained(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&drained), options_.timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("the task's end waited ", absl::FormatDuration(options_.timeout), " for ",
                       queue_.size() + (sending_ ? 1 : 0), " step reports to be sent"));
    }
  }
  return SendWithRetries([&] { return next_->ReportTaskEnd(report); });
}

absl::Status AsyncTaskReporter::SendWithRetries(const std::function<absl::Status()>& send) {
  const absl::Time give_up = absl::Now() + options_.retry_for;
  absl::Duration wait = options_.first_retry;
  for (;;) {
    absl::Status sent = send();
    const bool unanswered = absl::IsUnavailable(sent) || absl::IsDeadlineExceeded(sent);
    if (!unanswered || absl::Now() + wait > give_up) return sent;
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping), wait)) return sent;
    wait = std::min(wait * 2, options_.max_retry_wait);
  }
}

void AsyncTaskReporter::Loop() {
  for (;;) {
    v1::ReportStepRequest report;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, nothing left
      report = std::move(queue_.front());
      queue_.pop_front();
      sending_ = true;
    }
    const absl::Status sent = SendWithRetries([&] { return next_->ReportStep(report); });
    if (!sent.ok()) {
      spdlog::warn("{} rank {}: reporting step {}: {}", report.job_id(), report.rank(),
                   report.step(), sent.message());
    }
    absl::MutexLock lock(&mu_);
    sending_ = false;
  }
}

}  // namespace stagecoach::worker
