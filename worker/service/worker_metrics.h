// The worker's Prometheus metrics (STYLE.md rule 13): step durations, durations per action type
// and data-plane bytes, all taken from the step reports a task sends to the coordinator.
// MetricsTaskReporter records each report on its way to the coordinator, so the task runner
// needs nothing beyond the reporter it already has. No LibTorch.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "worker/runtime/task/task_runner.h"

namespace stagecoach::worker {

// Thread-safe.
class WorkerMetrics {
 public:
  // Defines the metrics on `registry`, which must outlive this object, with every action type
  // and direction pre-initialised (stagecoach_build_info is the daemon's:
  // metrics::AddBuildInfo).
  explicit WorkerMetrics(prometheus::Registry& registry);

  // Records one step of one of this worker's tasks: its step time, each timed executed
  // action's duration (end - start, waits included) under its type ("F", "SEND_F", ...), and
  // the bytes it sent and received, in all and to/from each peer rank. Actions that do not
  // parse are not recorded.
  void ObserveStep(const v1::ReportStepRequest& report);

 private:
  prometheus::Histogram& step_duration_;
  // By ActionTypeName; filled in the constructor and read-only afterwards.
  std::map<std::string, prometheus::Histogram*, std::less<>> action_duration_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Counter& bytes_sent_;
  prometheus::Counter& bytes_received_;
  // stagecoach_worker_peer_bytes_total{peer_rank, direction}: series appear as peers do.
  prometheus::Family<prometheus::Counter>& peer_bytes_;
  // Gradient reduction across data-parallel replicas (steps that carry one).
  prometheus::Histogram& reduction_duration_;
  prometheus::Histogram& reduction_wait_;
  prometheus::Family<prometheus::Counter>& reduction_bytes_;
  prometheus::Counter& reduction_bytes_sent_;
  prometheus::Counter& reduction_bytes_received_;
  prometheus::Gauge& reduction_hidden_ratio_;
};

// A TaskReporter that records every step report in a WorkerMetrics, then forwards it (and the
// task-end report) to `next`. Thread-safe as `next` is.
class MetricsTaskReporter : public runtime::TaskReporter {
 public:
  // Neither is owned; both must outlive this object.
  MetricsTaskReporter(runtime::TaskReporter* next, WorkerMetrics* metrics)
      : next_(next), metrics_(metrics) {}

  absl::Status ReportStep(const v1::ReportStepRequest& report) override;
  absl::Status ReportTaskEnd(const v1::ReportTaskEndRequest& report) override;

 private:
  runtime::TaskReporter* const next_;
  WorkerMetrics* const metrics_;
};

}  // namespace stagecoach::worker
