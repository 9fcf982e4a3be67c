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

absl::StatusOr<ReplicaMembership::Outcome> ReplicaMembership::Settle(
    int64_t step, int64_t global_step, const absl::Status& failure,
    const std::vector<double>& losses) {
  v1::SettleStepRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_job_id(options_.job_id);
  request.set_attempt(options_.attempt);
  request.set_rank(options_.rank);
  request.set_replica(options_.replica);
  request.set_step(step);
  request.set_global_step(global_step);
  request.set_epoch(epoch_);
  request.set_failed(!failure.ok());
  request.set_error(std::string(failure.message()));
  for (double loss : losses) request.add_microbatch_losses(loss);
  for (int s : slices_) request.add_slices(s);
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::Status last = absl::OkStatus();
  while (absl::Now() < deadline) {
    *request.mutable_wait() = rpc::ToProtoDuration(std::min(options_.poll, deadline - absl::Now()));
    absl::StatusOr<v1::SettleStepResponse> answer = settle_(request);
    if (!answer.ok()) {
      // The coordinator may be briefly unreachable: ask again until the deadline.
      last = answer.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    switch (answer->decision()) {
      case v1::SettleStepResponse::COMMIT:
        return Outcome::kCommit;
      case v1::SettleStepResponse::RETRY:
        RETURN_IF_ERROR(Adopt(*answer));
        return Outcome::kRetry;
      case v1::SettleStepResponse::STOP:
        return absl::AbortedError(absl::StrCat(
            "rank ", options_.rank, " replica ", options_.replica, " stopped at global step ",
            global_step, " by the coordinator: ", answer->reason(),
            failure.ok() ? "" : absl::StrCat(" (the step had failed: ", failure.message(), ")")));
      default:
        break;  // WAIT: ask again
    }
  }
  return absl::DeadlineExceededError(
      absl::StrCat("rank ", options_.rank, " replica ", options_.replica, ": global step ",
                   global_step, " was not settled within ", absl::FormatDuration(options_.timeout),
                   last.ok() ? "" : absl::StrCat(" (last SettleStep error: ", last.message(), ")"),
                   failure.ok() ? "" : absl::StrCat("; the step had failed: ", failure.message())));
}

absl::Status ReplicaMembership::Adopt(const v1::SettleStepResponse& response) {
  const std::vector<int> healthy(response.healthy_replicas().begin(),
                                 response.healthy_replicas().end());
  const auto me = std::find(healthy.begin(), healthy.end(), options_.replica);
  if (me == healthy.end() || response.slices().empty()) {
    return absl::InternalError(absl::StrCat("SettleStep RETRY without replica ", options_.replica,
                                            " among the healthy ones or without its slices"));
  }
  epoch_ = response.epoch();
  group_rank_ = static_cast<int>(me - healthy.begin());
  slices_.assign(response.slices().begin(), response.slices().end());
  spdlog::warn("{} rank {} replica {}: {}; now group rank {} of {}, slices {}", options_.job_id,
               options_.rank, options_.replica, response.reason(), group_rank_, healthy.size(),
               absl::StrJoin(slices_, ","));
  return regroup_(epoch_, group_rank_, static_cast<int>(healthy.size()));
}

}  // namespace stagecoach::runtime
