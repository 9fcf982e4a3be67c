// Step aggregation: every rank's report of a step (ReportStepRequest) is checked and recorded
// (its bytes, executed actions, timings for the step trace, losses and bubble ratio); when the
// last rank of a step has reported, the step is complete: the job's loss and largest bubble
// ratio of the step are recorded, a step_completed event is logged, the metrics get the step,
// and a client batch step (StepJob) gets its losses.
//
// Step numbers: `step` counts the current attempt's steps (the rank's own count); the step's
// number in the job's timeline is attempt_base + step. Loss = mean of the microbatch losses the
// rank owning the last stage reports.
//
// No lock of its own: called with the job table's lock held. The checkpoint files a report
// carries are checkpoint collection's (checkpoint_collection.h).
#pragma once

#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/jobs/job.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "stagecoach/v1/coordinator.pb.h"

namespace stagecoach::coordinator {

class StepAggregator {
 public:
  // `metrics` may be null.
  explicit StepAggregator(CoordinatorMetrics* metrics) : metrics_(metrics) {}

  // A training (or forward-only job's) step report from `slot`'s rank: its step must be the next
  // one the rank owes, the last stage's rank reports one loss per microbatch (unless the job is
  // forward-only), and timings come one per executed action. INVALID_ARGUMENT naming the field.
  absl::Status CheckLocked(const Job& job, const RankSlot& slot,
                           const v1::ReportStepRequest& req) const;

  // A step report sent again after its answer was lost (a worker's reporter retries the calls
  // that got no answer, worker/service/async_task_reporter.h): its step is one the rank already
  // reported, so it is counted once and the report changes nothing.
  static bool IsCountedAlready(const RankSlot& slot, const v1::ReportStepRequest& req) {
    return req.step() >= 0 && req.step() < slot.steps_done;
  }

  // Records a checked report; returns true when it completed its step (see the file comment).
  // A step is complete once every rank of the healthy replicas (ReplicaHealth) reported it.
  bool AddLocked(Job& job, RankSlot& slot, const v1::ReportStepRequest& req, absl::Time now);

  // Replicas that carry on: the losses of a settled step (SettleStep), by slice, which the
  // reports need not bring then (a rank of a replica lost after the step may never report it).
  static void AddSettledLossesLocked(Job& job, int64_t step,
                                     std::map<int, std::vector<double>> losses);

  // After a replica was lost: completes the steps whose reports from the healthy replicas are
  // all in. Returns how many it completed.
  int CompleteWaitingStepsLocked(Job& job, absl::Time now);

  // A forward-only client step's report (ReportStepRequest.forward_only_step): the job must
  // have such a step in flight at req.global_step, and the last stage's rank sends one output
  // row per input row. INVALID_ARGUMENT naming the field. The step is done when every rank
  // reported it.
  absl::Status AddForwardOnlyLocked(Job& job, const RankSlot& slot,
                                    const v1::ReportStepRequest& req);

  // A held rank's checkpoint of where it holds (ReportStepRequest.checkpoint_only): it reports
  // files, at its last step. INVALID_ARGUMENT otherwise.
  static absl::Status CheckCheckpointOnly(const RankSlot& slot, const v1::ReportStepRequest& req);

 private:
  // Whether every rank of the healthy replicas reported `agg`'s step, `step`.
  static bool AllReportedLocked(const Job& job, const StepAggregate& agg, int64_t step);
  // The last rank of `step` reported: the step is complete.
  void CompleteStepLocked(Job& job, int64_t step, absl::Time now);
  // The training recipe's part of a completed training step: its learning rate, gradient norm,
  // skip and validation loss into the event and the job's TrainingRecord; a run of
  // training.max_skipped_steps skipped steps sets the job's step_failure.
  static void RecordRecipeLocked(Job& job, const StepAggregate& agg, int64_t global,
                                 v1::StepCompleted& step);
  // The validation loss of a step whose pass ran: the mean of every replica's microbatch losses,
  // or with their token counts (the loss normalised by tokens) the sum of the counted tokens'
  // losses over their count. None when nothing was counted.
  static std::optional<double> EvalLoss(const StepAggregate& agg);
  // The ranks' measured activation peaks: into the event and the job's latest and largest per
  // rank.
  void RecordMemoryLocked(Job& job, const StepAggregate& agg, v1::StepCompleted& step);
  // The step's memory metrics, after its StepCompleted (which keeps the job's series): the
  // measured activation peaks with the plan's predictions, and what each task holds after it.
  void MemoryMetricsLocked(const Job& job, const StepAggregate& agg);
  // The diagnosis's part (coordinator/diagnosis/): the step's duration for the stall bound, the
  // straggler rule over the step's compute, its events and the ranks' pace metrics.
  void RecordDiagnosisLocked(Job& job, int64_t global, absl::Time now);

  CoordinatorMetrics* const metrics_;
};

}  // namespace stagecoach::coordinator
