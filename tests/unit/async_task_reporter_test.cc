// AsyncTaskReporter (worker/service/async_task_reporter.h): step reports leave the caller at
// once and reach the next reporter in order; a task's end waits for its steps; a full queue and
// a queue that does not drain are bounded by the timeout; a call that got no answer is sent
// again (in order, for a bounded time), one the coordinator refused is not.
#include "worker/service/async_task_reporter.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::worker::async_task_reporter_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Records what reaches it ("step N", "end"); holds every step report until released.
class RecordingReporter : public runtime::TaskReporter {
 public:
  absl::Status ReportStep(const v1::ReportStepRequest& report) override {
    if (!entered_.HasBeenNotified()) entered_.Notify();  // only the reporter's thread calls
    released_.WaitForNotification();
    absl::MutexLock lock(&mu_);
    seen_.push_back("step " + std::to_string(report.step()));
    if (report.step() != fail_step_ || fail_times_ == 0) return absl::OkStatus();
    if (fail_times_ > 0) --fail_times_;
    return fail_with_;
  }
  absl::Status ReportTaskEnd(const v1::ReportTaskEndRequest&) override {
    absl::MutexLock lock(&mu_);
    seen_.push_back("end");
    if (end_fails_ == 0) return absl::OkStatus();
    --end_fails_;
    return absl::UnavailableError("coordinator away");
  }
  void Release() { released_.Notify(); }
  // Until a step report reached ReportStep (and waits there for Release).
  bool AwaitFirstStep(absl::Duration timeout) {
    return entered_.WaitForNotificationWithTimeout(timeout);
  }
  std::vector<std::string> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }
  // Step `fail_step_`'s report fails `fail_times_` times (-1: always) with `fail_with_`.
  int fail_step_ = -1;
  int fail_times_ = -1;
  absl::Status fail_with_ = absl::InvalidArgumentError("step: refused");
  int end_fails_ = 0;  // the task's end fails this many times (UNAVAILABLE)

 private:
  absl::Notification entered_, released_;
  absl::Mutex mu_;
  std::vector<std::string> seen_;
};

v1::ReportStepRequest Step(int step) {
  v1::ReportStepRequest report;
  report.set_job_id("job-1");
  report.set_step(step);
  return report;
}

TEST(AsyncTaskReporter, StepsLeaveAtOnceAndArriveInOrderBeforeTheEnd) {
  RecordingReporter next;
  AsyncTaskReporter reporter(&next);
  for (int s = 0; s < 5; ++s) ASSERT_TRUE(reporter.ReportStep(Step(s)).ok());
  EXPECT_TRUE(next.seen().empty());  // held by `next`, yet ReportStep returned
  next.Release();
  ASSERT_TRUE(reporter.ReportTaskEnd(v1::ReportTaskEndRequest()).ok());
  EXPECT_THAT(next.seen(), ElementsAre("step 0", "step 1", "step 2", "step 3", "step 4", "end"));
}

TEST(AsyncTaskReporter, AFullQueueWaitsAndThenRefusesNamingTheBacklog) {
  RecordingReporter next;
  AsyncTaskReporterOptions options;
  options.max_pending = 2;
  options.timeout = absl::Milliseconds(200);
  AsyncTaskReporter reporter(&next, options);
  // One report in the thread's hands, two queued: the fourth finds no room.
  ASSERT_TRUE(reporter.ReportStep(Step(0)).ok());
  ASSERT_TRUE(next.AwaitFirstStep(absl::Seconds(10)));
  ASSERT_TRUE(reporter.ReportStep(Step(1)).ok());
  ASSERT_TRUE(reporter.ReportStep(Step(2)).ok());
  const absl::Time start = absl::Now();
  const absl::Status full = reporter.ReportStep(Step(3));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_EQ(full.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(full.message(), HasSubstr("2 earlier step reports still wait"));
  // The task's end cannot wait for them either.
  const absl::Status end = reporter.ReportTaskEnd(v1::ReportTaskEndRequest());
  EXPECT_EQ(end.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(end.message(), HasSubstr("for 3 step reports"));
  next.Release();
  ASSERT_TRUE(reporter.ReportTaskEnd(v1::ReportTaskEndRequest()).ok());
  EXPECT_THAT(next.seen(), ElementsAre("step 0", "step 1", "step 2", "end"));
}

TEST(AsyncTaskReporter, ARefusedReportIsLoggedAndTheNextOnesStillGo) {
  RecordingReporter next;
  next.fail_step_ = 1;
  next.Release();
  AsyncTaskReporter reporter(&next);
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(reporter.ReportStep(Step(s)).ok());
  ASSERT_TRUE(reporter.ReportTaskEnd(v1::ReportTaskEndRequest()).ok());
  EXPECT_THAT(next.seen(), ElementsAre("step 0", "step 1", "step 2", "end"));
}

AsyncTaskReporterOptions QuickRetries() {
  AsyncTaskReporterOptions options;
  options.first_retry = absl::Milliseconds(1);
  options.max_retry_wait = absl::Milliseconds(2);
  return options;
}

TEST(AsyncTaskReporter, AnUnansweredReportIsSentAgainUntilAnsweredAndTheOrderHolds) {
  for (const absl::Status& unanswered :
       {absl::UnavailableError("connect failed"), absl::DeadlineExceededError("no answer")}) {
    RecordingReporter next;
    next.fail_step_ = 1;
    next.fail_times_ = 2;
    next.fail_with_ = unanswered;
    next.end_fails_ = 1;
    next.Release();
    AsyncTaskReporter reporter(&next, QuickRetries());
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(reporter.ReportStep(Step(s)).ok());
    ASSERT_TRUE(reporter.ReportTaskEnd(v1::ReportTaskEndRequest()).ok());
    EXPECT_THAT(next.seen(),
                ElementsAre("step 0", "step 1", "step 1", "step 1", "step 2", "end", "end"))
        << unanswered;
  }
}

TEST(AsyncTaskReporter, AReportStillUnansweredAfterRetryForIsDroppedAndTheNextOnesGo) {
  RecordingReporter next;
  next.fail_step_ = 1;
  next.fail_with_ = absl::UnavailableError("partitioned");
  next.Release();
  AsyncTaskReporterOptions options = QuickRetries();
  options.retry_for = absl::Milliseconds(50);
  AsyncTaskReporter reporter(&next, options);
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(reporter.ReportStep(Step(s)).ok());
  ASSERT_TRUE(reporter.ReportTaskEnd(v1::ReportTaskEndRequest()).ok());
  const std::vector<std::string> seen = next.seen();
  ASSERT_GE(seen.size(), 5u);
  EXPECT_GT(std::count(seen.begin(), seen.end(), "step 1"), 2);
  EXPECT_THAT(std::vector<std::string>(seen.end() - 2, seen.end()), ElementsAre("step 2", "end"));
}

TEST(AsyncTaskReporter, DestroyingItForwardsWhatIsQueued) {
  RecordingReporter next;
  {
    AsyncTaskReporter reporter(&next);
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(reporter.ReportStep(Step(s)).ok());
    next.Release();
  }
  EXPECT_THAT(next.seen(), ElementsAre("step 0", "step 1", "step 2"));
}

}  // namespace
}  // namespace stagecoach::worker::async_task_reporter_test
