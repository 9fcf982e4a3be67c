// StepControl::StepJob: one step of a PAUSED job on a client's batch (training, or
// forward-only), like PyTorch's schedule.step(x, target=y). See step_control.h.
#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/rpc/tensor_data.h"
#include "common/rpc/time_conversion.h"
#include "common/util/status_macros.h"
#include "coordinator/control/step_control.h"

namespace stagecoach::coordinator {
namespace {

// Ragged rows' lengths: none, or one per row of the inputs, each 1 to their padded width.
absl::Status CheckRowLengths(const v1::StepJobRequest& request) {
  const auto& lengths = request.row_lengths();
  if (lengths.empty()) return absl::OkStatus();
  const v1::TensorData& inputs = request.inputs();
  if (inputs.shape_size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_lengths: ragged rows need inputs of rows and positions (2 or more "
                     "dimensions), got ",
                     rpc::DescribeTensorData(inputs)));
  }
  if (lengths.size() != inputs.shape(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_lengths: ", lengths.size(), " lengths for ", inputs.shape(0), " rows"));
  }
  for (int i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1 || lengths[i] > inputs.shape(1)) {
      return absl::InvalidArgumentError(absl::StrCat("row_lengths[", i, "]: ", lengths[i],
                                                     " is not within 1 to the rows' ",
                                                     "padded width of ", inputs.shape(1)));
    }
  }
  return absl::OkStatus();
}

// The client's batch against the job: at least a row per microbatch; targets with one row per
// input row for a training step, which needs a job with a backward. INVALID_ARGUMENT naming the
// field.
absl::Status CheckClientBatch(const Job& job, const v1::StepJobRequest& request) {
  RETURN_IF_ERROR(rpc::ValidateTensorData(request.inputs(), "inputs"));
  const v1::TensorData& inputs = request.inputs();
  const int64_t m = static_cast<int64_t>(job.plan.num_microbatches) * job.plan.replicas;
  if (inputs.shape_size() < 1 || inputs.shape(0) < m) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inputs: needs at least as many rows (dim 0) as the job's ", m, " microbatches",
        job.plan.replicas > 1 ? absl::StrCat(" (", job.plan.num_microbatches, " per replica x ",
                                             job.plan.replicas, " replicas)")
                              : "",
        ", got ", rpc::DescribeTensorData(inputs)));
  }
  RETURN_IF_ERROR(CheckRowLengths(request));
  if (request.forward_only()) return absl::OkStatus();
  if (job.forward_only()) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward_only: job ", job.id, "'s schedule ", job.plan.schedule_name,
                     " has no backward, so only forward-only client steps run on it"));
  }
  if (!request.has_targets()) {
    return absl::InvalidArgumentError(
        "targets: required for a training step (or set forward_only for inference)");
  }
  RETURN_IF_ERROR(rpc::ValidateTensorData(request.targets(), "targets"));
  if (request.targets().shape_size() < 1 || request.targets().shape(0) != inputs.shape(0)) {
    return absl::InvalidArgumentError(absl::StrCat("targets: needs one row per input row (",
                                                   inputs.shape(0), "), got ",
                                                   rpc::DescribeTensorData(request.targets())));
  }
  return absl::OkStatus();
}

// The ControlTask request of each rank for a client step at global step `global`: the inputs go
// to stage 0's rank, the targets to the last stage's.
std::vector<v1::ControlTaskRequest> ClientStepRequests(const Job& job,
                                                       const v1::StepJobRequest& request,
                                                       int64_t global) {
  const bool forward_only = request.forward_only();
  const int first_rank = job.plan.stage_to_rank[0];
  const int last_rank = job.plan.stage_to_rank[job.plan.num_stages - 1];
  std::vector<v1::ControlTaskRequest> out;
  for (const RankSlot& slot : job.ranks) {
    v1::ControlTaskRequest r = ControlRequest(job, forward_only ? global : global + 1);
    v1::ClientStep* cs = r.mutable_client_step();
    cs->set_global_step(global);
    cs->set_forward_only(forward_only);
    for (int64_t d : request.inputs().shape()) cs->add_inputs_shape(d);
    cs->set_inputs_dtype(request.inputs().dtype());
    *cs->mutable_row_lengths() = request.row_lengths();
    if (slot.rank == first_rank) *cs->mutable_inputs() = request.inputs();
    if (slot.rank == last_rank && !forward_only) *cs->mutable_targets() = request.targets();
    out.push_back(std::move(r));
  }
  return out;
}

// The reply of a client step whose ranks all reported.
absl::StatusOr<v1::StepJobResponse> ClientStepResponse(const std::string& job_id, int64_t global,
                                                       bool forward_only,
                                                       Job::ClientStepState done) {
  v1::StepJobResponse response;
  response.set_global_step(global);
  *response.mutable_step_time() = rpc::ToProtoDuration(done.slowest);
  if (forward_only) {
    if (!done.outputs.has_value()) {
      return absl::InternalError(absl::StrCat("job ", job_id, ": no outputs came back"));
    }
    *response.mutable_outputs() = *std::move(done.outputs);
    return response;
  }
  for (double l : done.losses) response.add_microbatch_losses(l);
  if (done.loss.has_value()) response.set_loss(*done.loss);
  return response;
}

}  // namespace

// A client step handed to the ranks, which StepJob then awaits.
struct StepControl::ClientStepCall {
  std::shared_ptr<Job> job;  // alive while awaited, even if the table drops it
  std::string job_id;
  int attempt = 0;
  int64_t global = 0;
  bool forward_only = false;
};

absl::StatusOr<v1::StepJobResponse> StepControl::StepJob(const v1::StepJobRequest& request,
                                                         absl::Duration timeout,
                                                         const std::function<bool()>& caller_gone) {
  ASSIGN_OR_RETURN(std::shared_ptr<absl::Mutex> control_mu, ControlLock(request.job_id()));
  absl::MutexLock control(control_mu.get());
  ASSIGN_OR_RETURN(ClientStepCall call, BeginClientStep(request));
  return AwaitClientStep(call, timeout, caller_gone);
}

absl::StatusOr<StepControl::ClientStepCall> StepControl::BeginClientStep(
    const v1::StepJobRequest& request) {
  const std::string& job_id = request.job_id();
  ClientStepCall call;
  call.job_id = job_id;
  call.forward_only = request.forward_only();
  std::vector<std::pair<int, std::string>> ranks;
  std::vector<v1::ControlTaskRequest> requests;
  {
    absl::MutexLock lock(&deps_.table->mu());
    ASSIGN_OR_RETURN(Job * job, deps_.table->FindOrErrorLocked(job_id));
    if (job->replica_health.degraded()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " carries on with replicas ", job->replica_health.healthy(), "/",
          job->replica_health.replicas(),
          " healthy; a client batch step needs every replica (the batch is cut for each)"));
    }
    if (job->state != v1::JOB_STATE_PAUSED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " is ", JobStateName(job->state),
          "; a client batch step needs a PAUSED job (pause it first, or submit it paused)"));
    }
    RETURN_IF_ERROR(CheckClientBatch(*job, request));
    call.global = job->global_done();
    Job::ClientStepState state;
    state.global_step = call.global;
    state.forward_only = call.forward_only;
    state.rows = request.inputs().shape(0);
    job->client_step = state;
    if (!call.forward_only) job->hold_step = call.global + 1;
    ranks = RankAddresses(*job);
    call.attempt = job->attempt;
    call.job = deps_.table->ShareLocked(job_id);
    requests = ClientStepRequests(*job, request, call.global);
  }
  int failed_rank = -1;
  const absl::Status sent = CallControl(ranks, requests, &failed_rank);
  const bool refused = absl::IsInvalidArgument(sent) || absl::IsFailedPrecondition(sent);
  int withdraw_failed = -1;
  const absl::Status withdrawn =
      refused ? WithdrawClientStep(call, ranks, failed_rank, &withdraw_failed) : absl::OkStatus();
  absl::MutexLock lock(&deps_.table->mu());
  Job& job = *call.job;
  if (job.attempt != call.attempt || job.state != v1::JOB_STATE_PAUSED) {
    job.client_step.reset();
    return absl::AbortedError(absl::StrCat("job ", job_id, " became ", JobStateName(job.state),
                                           " while the client step was sent: ", job.reason));
  }
  if (!sent.ok()) {
    job.client_step.reset();
    if (!call.forward_only) job.hold_step = call.global;
    if (refused && withdrawn.ok()) return sent;  // the job stays PAUSED
    if (refused) {
      deps_.lifecycle->ControlFailedLocked(job, withdraw_failed, withdrawn,
                                           absl::StrCat("withdrawing the client step of ", job_id));
      return withdrawn;
    }
    deps_.lifecycle->ControlFailedLocked(job, failed_rank, sent,
                                         absl::StrCat("client step of ", job_id));
    return sent;
  }
  if (!call.forward_only) {
    RETURN_IF_ERROR(job.TransitionTo(v1::JOB_STATE_RUNNING,
                                     absl::StrCat("client batch step at global step ", call.global),
                                     deps_.clock->Now()));
  }
  return call;
}

absl::Status StepControl::WithdrawClientStep(const ClientStepCall& call,
                                             const std::vector<std::pair<int, std::string>>& ranks,
                                             int refused_rank, int* failed_rank) {
  // A rank refused the batch: the ranks called before it took it, and may have started it (a
  // step needs every rank, so none can finish it). They are told to hold where they are before
  // StepJob returns and the job's control lock is released: sent later, the withdrawal could
  // reach a rank after a Resume and stop the steps that started.
  std::vector<std::pair<int, std::string>> took;
  for (const auto& rank : ranks) {
    if (rank.first == refused_rank) break;
    took.push_back(rank);
  }
  if (took.empty()) return absl::OkStatus();
  v1::ControlTaskRequest hold;
  hold.set_job_id(call.job_id);
  hold.set_attempt(call.attempt);
  hold.set_step_limit(call.global);
  int most = 0;
  for (const auto& rank : took) most = std::max(most, rank.first + 1);
  return CallControl(took, std::vector<v1::ControlTaskRequest>(most, hold), failed_rank);
}

absl::StatusOr<v1::StepJobResponse> StepControl::AwaitClientStep(
    const ClientStepCall& call, absl::Duration timeout, const std::function<bool()>& caller_gone) {
  absl::Mutex& mu = deps_.table->mu();
  absl::MutexLock lock(&mu);
  Job& job = *call.job;
  const absl::Time deadline = deps_.clock->Now() + timeout;
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return stopping_ || job.attempt != call.attempt || IsFinal(job.state) ||
           job.state == v1::JOB_STATE_RESTARTING ||
           (job.client_step.has_value() && job.client_step->done &&
            job.state == v1::JOB_STATE_PAUSED);
  };
  while (!settled()) {
    const absl::Duration left = deadline - deps_.clock->Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "job ", call.job_id, ": the client step at global step ", call.global,
          " did not finish within ", absl::FormatDuration(timeout), " (the job keeps running it)"));
    }
    if (caller_gone && caller_gone()) {
      return absl::CancelledError(
          absl::StrCat("job ", call.job_id, ": the caller of StepJob went away"));
    }
    mu.AwaitWithTimeout(absl::Condition(&settled), std::min(left, options_.poll_interval));
  }
  if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
  if (!(job.client_step.has_value() && job.client_step->done) || job.attempt != call.attempt) {
    job.client_step.reset();
    return absl::AbortedError(absl::StrCat("job ", call.job_id, " became ", JobStateName(job.state),
                                           " during the client step: ", job.reason));
  }
  Job::ClientStepState done = *std::move(job.client_step);
  job.client_step.reset();
  return ClientStepResponse(call.job_id, call.global, call.forward_only, std::move(done));
}

}  // namespace stagecoach::coordinator
