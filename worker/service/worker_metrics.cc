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
                      .Register(registry)),
      reduction_duration_(prometheus::BuildHistogram()
                              .Name("stagecoach_worker_allreduce_duration_seconds")
                              .Help("Gradient reduction across data-parallel replicas in a step, "
                                    "first bucket start to last bucket end")
                              .Register(registry)
                              .Add({}, metrics::DurationBucketsSeconds())),
      reduction_wait_(prometheus::BuildHistogram()
                          .Name("stagecoach_worker_allreduce_wait_seconds")
                          .Help("Time compute waited for the gradient reduction in a step")
                          .Register(registry)
                          .Add({}, metrics::DurationBucketsSeconds())),
      reduction_bytes_(prometheus::BuildCounter()
                           .Name("stagecoach_worker_allreduce_bytes_total")
                           .Help("Bytes this worker's gradient reduction sent and received, by "
                                 "direction")
                           .Register(registry)),
      reduction_bytes_sent_(reduction_bytes_.Add({{"direction", "sent"}})),
      reduction_bytes_received_(reduction_bytes_.Add({{"direction", "received"}})),
      reduction_hidden_ratio_(prometheus::BuildGauge()
                                  .Name("stagecoach_worker_grad_reduction_hidden_ratio")
                                  .Help("Share (0..1) of the last step's gradient reduction "
                                        "hidden behind compute")
                                  .Register(registry)
                                  .Add({})) {
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
  if (report.has_reduction()) {
    const v1::GradientReduction& r = report.reduction();
    reduction_duration_.Observe(absl::ToDoubleSeconds(rpc::FromProtoDuration(r.span())));
    reduction_wait_.Observe(absl::ToDoubleSeconds(rpc::FromProtoDuration(r.waited())));
    reduction_bytes_sent_.Increment(static_cast<double>(r.bytes_sent()));
    reduction_bytes_received_.Increment(static_cast<double>(r.bytes_received()));
    reduction_hidden_ratio_.Set(r.hidden_ratio());
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
