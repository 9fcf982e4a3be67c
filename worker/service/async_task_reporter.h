// Step reports off the task's thread. A step report is a unary call to the coordinator (plus the
// worker's metrics for it); made on the task's thread, between one step's optimizer step and the
// next step's first action, it sat on the pipeline's critical path (about 0.9 ms of a 1F1B step
// on a 2-core machine, bench/peer_bench.cc). AsyncTaskReporter hands the report to a thread of
// its own and returns.
//
// Contract:
//  - Step reports reach `next` in the order ReportStep was called, one at a time, from the
//    reporter's thread. A report `next` refuses is logged (job, rank, step and why), as the
//    task's thread did; reports carry no answer, so nothing else is lost.
//  - ReportTaskEnd first waits until every step report queued before it has been forwarded, so
//    the coordinator sees a task's steps before its end, then forwards the end report on the
//    calling thread.
//  - At most `max_pending` reports wait; ReportStep on a full queue waits for room. Every wait is
//    bounded by `timeout`: a queue that does not drain in time (the coordinator stopped
//    answering, each call then takes its own deadline) gives DEADLINE_EXCEEDED naming what was
//    waiting, and the report is not queued.
//  - A report whose call gets no answer (UNAVAILABLE, DEADLINE_EXCEEDED: the coordinator is
//    unreachable, e.g. partitioned, or restarting) is sent again, after 100 ms doubling to 2 s,
//    for up to `retry_for` since its first call; the reports after it wait, so the order holds.
//    A report the coordinator answered (taken or refused) is never sent again. The coordinator
//    takes a report sent again after its answer was lost as the same report (it counts each step
//    of a rank once). ReportTaskEnd is retried the same way.
//  - The destructor forwards what is queued (bounded by `timeout`), then stops the thread.
// Thread-safe.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "worker/runtime/task/task_runner.h"

namespace stagecoach::worker {

struct AsyncTaskReporterOptions {
  size_t max_pending = 64;
  absl::Duration timeout = absl::Seconds(30);
  absl::Duration retry_for = absl::Minutes(2);
  absl::Duration first_retry = absl::Milliseconds(100);
  absl::Duration max_retry_wait = absl::Seconds(2);
};

class AsyncTaskReporter : public runtime::TaskReporter {
 public:
  // `next` is not owned and must outlive this object.
  explicit AsyncTaskReporter(runtime::TaskReporter* next, AsyncTaskReporterOptions options = {});
  ~AsyncTaskReporter() override;

  absl::Status ReportStep(const v1::ReportStepRequest& report) override;
  absl::Status ReportTaskEnd(const v1::ReportTaskEndRequest& report) override;

 private:
  void Loop();
  // Calls `send` until the coordinator answers, `retry_for` passes or the reporter stops (see
  // the contract); the last call's status.
  absl::Status SendWithRetries(const std::function<absl::Status()>& send);
  bool Drained() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !sending_; }

  runtime::TaskReporter* const next_;
  const AsyncTaskReporterOptions options_;
  absl::Mutex mu_;
  std::deque<v1::ReportStepRequest> queue_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;  // the thread holds a report it took off the queue
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace stagecoach::worker
