#include "worker/runtime/training/replica_membership.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {

ReplicaMembership::ReplicaMembership(MembershipOptions options, StepSettler settle, Regroup regroup)
    : options_(std::move(options)),
      settle_(std::move(settle)),
      regroup_(std::move(regroup)),
      group_rank_(options_.replica),
      slices_({options_.replica}) {}

absl::StatusOr<v1::SettleStepResponse> ReplicaMembership::Ask(v1::SettleStepRequest request,
                                                              absl::Time deadline) {
  request.set_worker_id(options_.worker_id);
  request.set_job_id(options_.job_id);
  request.set_attempt(options_.attempt);
  request.set_rank(options_.rank);
  request.set_replica(options_.replica);
  absl::Status last = absl::DeadlineExceededError("no time left to ask");
  while (absl::Now() < deadline) {
    *request.mutable_wait() = rpc::ToProtoDuration(std::min(options_.poll, deadline - absl::Now()));
    absl::StatusOr<v1::SettleStepResponse> answer = settle_(request);
    if (answer.ok() && answer->decision() != v1::SettleStepResponse::WAIT) return answer;
    // WAIT, or the coordinator briefly unreachable: ask again until the deadline.
    if (!answer.ok()) {
      last = answer.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return last;
}

absl::StatusOr<ReplicaMembership::Outcome> ReplicaMembership::Settle(
    int64_t step, int64_t global_step, const absl::Status& failure,
    const std::vector<double>& losses) {
  v1::SettleStepRequest request;
  request.set_step(step);
  request.set_global_step(global_step);
  request.set_epoch(epoch_);
  request.set_failed(!failure.ok());
  request.set_error(std::string(failure.message()));
  for (double loss : losses) request.add_microbatch_losses(loss);
  for (int s : slices_) request.add_slices(s);
  absl::StatusOr<v1::SettleStepResponse> answer =
      Ask(std::move(request), absl::Now() + options_.timeout);
  if (!answer.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", options_.rank, " replica ", options_.replica, ": global step ", global_step,
        " was not settled within ", absl::FormatDuration(options_.timeout), " (",
        answer.status().message(), ")",
        failure.ok() ? "" : absl::StrCat("; the step had failed: ", failure.message())));
  }
  switch (answer->decision()) {
    case v1::SettleStepResponse::COMMIT:
      // A later membership takes a healed replica in before the next step.
      if (answer->epoch() > epoch_) pending_ = *answer;
      return Outcome::kCommit;
    case v1::SettleStepResponse::RETRY:
      RETURN_IF_ERROR(Adopt(*answer));
      return Outcome::kRetry;
    default:
      return absl::AbortedError(absl::StrCat(
          "rank ", options_.rank, " replica ", options_.replica, " stopped at global step ",
          global_step, " by the coordinator: ", answer->reason(),
          failure.ok() ? "" : absl::StrCat(" (the step had failed: ", failure.message(), ")")));
  }
}

absl::Status ReplicaMembership::ApplyPending() {
  if (!pending_.has_value()) return absl::OkStatus();
  const v1::SettleStepResponse pending = *std::move(pending_);
  pending_.reset();
  return Adopt(pending);
}

absl::StatusOr<JoinPoint> ReplicaMembership::Join() {
  v1::SettleStepRequest request;
  request.set_joining(true);
  ASSIGN_OR_RETURN(const v1::SettleStepResponse answer,
                   Ask(std::move(request), absl::Now() + options_.join_timeout));
  if (answer.decision() != v1::SettleStepResponse::JOIN) {
    return absl::AbortedError(absl::StrCat("rank ", options_.rank, " replica ", options_.replica,
                                           " (a replacement) did not join: ", answer.reason()));
  }
  RETURN_IF_ERROR(Adopt(answer));
  return JoinPoint{answer.join_global_step(), answer.step_limit(), answer.finish_at_limit()};
}

absl::Status ReplicaMembership::Adopt(const v1::SettleStepResponse& response) {
  const std::vector<int> healthy(response.healthy_replicas().begin(),
                                 response.healthy_replicas().end());
  const auto me = std::find(healthy.begin(), healthy.end(), options_.replica);
  if (me == healthy.end() || response.slices().empty()) {
    return absl::InternalError(absl::StrCat("SettleStep answered without replica ",
                                            options_.replica,
                                            " among the healthy ones or without its slices"));
  }
  epoch_ = response.epoch();
  group_rank_ = static_cast<int>(me - healthy.begin());
  slices_.assign(response.slices().begin(), response.slices().end());
  MembershipChange change;
  change.epoch = epoch_;
  change.group_rank = group_rank_;
  change.group_size = static_cast<int>(healthy.size());
  if (response.join_global_step() >= 0) {
    const auto donor = std::find(healthy.begin(), healthy.end(), response.donor_replica());
    if (donor == healthy.end()) {
      return absl::InternalError(absl::StrCat("SettleStep named donor replica ",
                                              response.donor_replica(),
                                              ", which is not among the healthy ones"));
    }
    change.donor = static_cast<int>(donor - healthy.begin());
    change.join_step = response.join_global_step();
  }
  spdlog::warn("{} rank {} replica {}: epoch {}, group rank {} of {}, slices {}{}", options_.job_id,
               options_.rank, options_.replica, epoch_, group_rank_, healthy.size(),
               absl::StrJoin(slices_, ","),
               change.donor >= 0 ? absl::StrCat("; state from group rank ", change.donor,
                                                " before global step ", change.join_step)
                                 : std::string());
  return regroup_(change);
}

}  // namespace stagecoach::runtime
