#include "worker/runtime/task/step_reports.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"
#include "worker/runtime/task/tensor_data.h"

namespace stagecoach::runtime {

StepReports::StepReports(const v1::TaskAssignment& task, std::string worker_id,
                         int64_t held_parameters, const transport::Transport* transport,
                         TaskReporter* reporter)
    : task_(task),
      worker_id_(std::move(worker_id)),
      held_parameters_(held_parameters),
      transport_(transport),
      reporter_(reporter) {}

StepMark StepReports::Mark() const { return StepMark{absl::Now(), transport_->stats()}; }

v1::ReportStepRequest StepReports::Header(int64_t step, int64_t global_step) const {
  v1::ReportStepRequest report;
  report.set_worker_id(worker_id_);
  report.set_job_id(task_.job_id());
  report.set_attempt(task_.attempt());
  report.set_rank(task_.rank());
  report.set_replica(task_.replica());
  report.set_step(step);
  report.set_global_step(global_step);
  report.set_parameters(held_parameters_);
  return report;
}

v1::ReportStepRequest StepReports::Step(
    const StepResult& result, const StepMark& mark, int64_t step, int64_t global_step,
    std::optional<transport::TransferStats> pipeline_end) const {
  const transport::TransferStats after = pipeline_end.value_or(transport_->stats());
  v1::ReportStepRequest report = Header(step, global_step);
  for (double l : result.microbatch_losses) report.add_microbatch_losses(l);
  for (const auto& a : result.executed) report.add_executed_actions(a);
  report.set_bytes_sent(after.bytes_sent - mark.stats.bytes_sent);
  report.set_bytes_received(after.bytes_received - mark.stats.bytes_received);
  for (const auto& [peer, bytes] : result.bytes_sent_to) {
    (*report.mutable_bytes_sent_to())[peer] = bytes;
  }
  for (const auto& [peer, bytes] : result.bytes_received_from) {
    (*report.mutable_bytes_received_from())[peer] = bytes;
  }
  *report.mutable_step_time() = rpc::ToProtoDuration(absl::Now() - mark.start);
  for (const ActionTiming& t : result.timings) {
    v1::ActionTiming* timing = report.add_action_timings();
    timing->set_start_us(absl::ToInt64Microseconds(t.start));
    timing->set_end_us(absl::ToInt64Microseconds(t.end));
    timing->set_wait_us(absl::ToInt64Microseconds(t.wait));
  }
  *report.mutable_step_start_time() = rpc::ToProtoTimestamp(result.start);
  report.set_bubble_ratio(result.bubble_ratio);
  report.set_peak_activation_bytes(result.peak_activation_bytes);
  return report;
}

void StepReports::AddRecipe(const RecipeDecision& decision, v1::ReportStepRequest* report) {
  report->set_learning_rate(decision.learning_rate);
  if (decision.grad_norm.has_value()) report->set_grad_norm(*decision.grad_norm);
  report->set_skipped(decision.skip);
  for (int rank : decision.nonfinite_ranks) report->add_nonfinite_ranks(rank);
}

namespace {

// `timings` (relative to mark.start) into `out`, moved to the report's step start.
void AddTimings(const std::vector<collectives::CollectiveTiming>& timings, const StepMark& mark,
                const v1::ReportStepRequest& report,
                google::protobuf::RepeatedPtrField<v1::ReductionBucket>* out) {
  const absl::Duration shift = rpc::FromProtoTimestamp(report.step_start_time()) - mark.start;
  for (const collectives::CollectiveTiming& t : timings) {
    v1::ReductionBucket* bucket = out->Add();
    bucket->set_stage(t.stage);
    bucket->set_bytes(t.bytes);
    *bucket->mutable_start() = rpc::ToProtoDuration(t.start - shift);
    *bucket->mutable_end() = rpc::ToProtoDuration(t.end - shift);
  }
}

}  // namespace

void StepReports::AddReduction(const ReductionReport& reduction, const StepMark& mark,
                               v1::ReportStepRequest* report) {
  v1::GradientReduction* out = report->mutable_reduction();
  out->set_bytes_sent(reduction.bytes_sent);
  out->set_bytes_received(reduction.bytes_received);
  *out->mutable_span() = rpc::ToProtoDuration(reduction.span);
  *out->mutable_waited() = rpc::ToProtoDuration(reduction.waited);
  out->set_hidden_ratio(reduction.hidden_ratio);
  out->set_gather_bytes_sent(reduction.gather_bytes_sent);
  AddTimings(reduction.buckets, mark, *report, out->mutable_buckets());
}

void StepReports::AddGathers(const GatherReport& gathers, const StepMark& mark,
                             v1::ReportStepRequest* report) {
  v1::GradientReduction* out = report->mutable_reduction();
  *out->mutable_gather_waited() = rpc::ToProtoDuration(gathers.waited);
  out->set_gather_hidden_ratio(gathers.hidden_ratio);
  AddTimings(gathers.gathers, mark, *report, out->mutable_gathers());
}

v1::ReportStepRequest StepReports::CheckpointOnly(int64_t step, int64_t global_step) const {
  v1::ReportStepRequest report = Header(step, global_step);
  report.set_checkpoint_only(true);
  return report;
}

void StepReports::Send(const v1::ReportStepRequest& report) const {
  absl::Status reported = reporter_->ReportStep(report);
  if (!reported.ok()) {
    spdlog::warn("{} rank {}: reporting step {}: {}", task_.job_id(), task_.rank(), report.step(),
                 reported.message());
  }
}

absl::StatusOr<v1::TensorData> MergedOutputs(const StepResult& result, int microbatches, int rank) {
  const size_t got = std::count_if(result.outputs.begin(), result.outputs.end(),
                                   [](const torch::Tensor& t) { return t.defined(); });
  if (got != static_cast<size_t>(microbatches)) {
    return absl::InternalError(absl::StrCat("rank ", rank, ": the step produced ", got, " of ",
                                            microbatches, " microbatch outputs"));
  }
  return ToTensorData(torch::cat(result.outputs, 0));
}

}  // namespace stagecoach::runtime
