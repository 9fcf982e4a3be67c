// The worker's Prometheus metrics (see worker_metrics.h).
#include "worker/service/worker_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "common/rpc/time_conversion.h"
#include "common/schedule/action.h"

namespace stagecoach::worker {
namespace {

using schedule::ActionType;

constexpr ActionType kAllActionTypes[] = {
    ActionType::kForward,      ActionType::kBackwardInput, ActionType::kBackwardWeight,
    ActionType::kFullBackward, ActionType::kUnshard,       ActionType::kReshard,
    ActionType::kSendF,        ActionType::kRecvF,         ActionType::kSendB,
    ActionType::kRecvB,        ActionType::kReduceGrad,    ActionType::kOverlapFB,
};

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry)
    : step_duration_(prometheus::BuildHistogram()
                         .Name("stagecoach_worker_step_duration_seconds")
                         .Help("Wall time of a step on this worker's rank, first action to the "
                               "end of the optimizer step")
                         .Register(registry)
                         .Add({}, metrics::DurationBucketsSeconds())),
      bytes_(prometheus::BuildCounter()
                 .Name("stagecoach_worker_bytes_total")
                 .Help("Data-plane bytes this worker sent and received, by direction")
                 .Register(registry)),
      bytes_sent_(bytes_.Add({{"direction", "sent"}})),
      bytes_received_(bytes_.Add({{"direction", "received"}})),
      peer_bytes_(prometheus::BuildCounter()
                      .Name("stagecoach_worker_peer_bytes_total")
                      .Help("Data-plane bytes this worker's rank sent to and received from each "
                            "peer rank of its job, by peer rank and direction")
                      .Register(registry)) {
  auto& actions = prometheus::BuildHistogram()
                      .Name("stagecoach_action_duration_seconds")
                      .Help(
                          "Duration of an executed schedule action on this worker, waits for "
                          "peers included, by action type")
                      .Register(registry);
  for (ActionType type : kAllActionTypes) {
    const std::string name(schedule::ActionTypeName(type));
    action_duration_[name] = &actions.Add({{"type", name}}, metrics::DurationBucketsSeconds());
  }
}

void WorkerMetrics::ObserveStep(const v1::ReportStepRequest& report) {
  step_duration_.Observe(absl::ToDoubleSeconds(rpc::FromProtoDuration(report.step_time())));
  if (report.bytes_sent() > 0) bytes_sent_.Increment(static_cast<double>(report.bytes_sent()));
  if (report.bytes_received() > 0) {
    bytes_received_.Increment(static_cast<double>(report.bytes_received()));
  }
  for (const auto& [direction, by_peer] : {std::pair{"sent", &report.bytes_sent_to()},
                                           std::pair{"received", &report.bytes_received_from()}}) {
    for (const auto& [peer, bytes] : *by_peer) {
      if (bytes <= 0) continue;
      peer_bytes_.Add({{"peer_rank", absl::StrCat(peer)}, {"direction", direction}})
          .Increment(static_cast<double>(bytes));
    }
  }
  const int timed = std::min(report.action_timings_size(), report.executed_actions_size());
  for (int i = 0; i < timed; ++i) {
    auto action = schedule::ParseAction(report.executed_actions(i));
    if (!action.ok() || !action->has_value()) continue;
    auto it = action_duration_.find(schedule::ActionTypeName((*action)->type));
    if (it == action_duration_.end()) continue;
    const v1::ActionTiming& t = report.action_timings(i);
    it->second->Observe(static_cast<double>(t.end_us() - t.start_us()) * 1e-6);
  }
}

absl::Status MetricsTaskReporter::ReportStep(const v1::ReportStepRequest& report) {
  metrics_->ObserveStep(report);
  return next_->ReportStep(report);
}

absl::Status MetricsTaskReporter::ReportTaskEnd(const v1::ReportTaskEndRequest& report) {
  return next_->ReportTaskEnd(report);
}

}  // namespace stagecoach::worker
