#include "worker/runtime/sharding/parameter_gathering.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {

ParameterGathering::ParameterGathering(ZeroShards* shards, collectives::Collectives* group,
                                       Executor* comm, absl::Duration timeout)
    : shards_(shards), group_(group), comm_(comm), timeout_(timeout) {
  absl::MutexLock lock(&mu_);
  for (int s : shards_->stages()) {
    shards_->ReleaseStage(s);
    stages_[s] = Stage{};
  }
}

ParameterGathering::~ParameterGathering() { scope_.Close(); }

void ParameterGathering::BeginStep(absl::Time step_start) {
  step_start_ = step_start;
  absl::MutexLock lock(&mu_);
  gathers_.clear();
  waited_ = absl::ZeroDuration();
}

GatherReport ParameterGathering::Report() const {
  GatherReport report;
  absl::MutexLock lock(&mu_);
  report.gathers = gathers_;
  report.waited = waited_;
  const collectives::CollectiveOverlap overlap = collectives::OverlapOf(gathers_, waited_);
  report.span = overlap.span;
  report.hidden_ratio = overlap.hidden_ratio;
  return report;
}

void ParameterGathering::Unshard(int stage) {
  {
    absl::MutexLock lock(&mu_);
    auto it = stages_.find(stage);
    // A stage without parameters, or one gathered (or being gathered) already.
    if (it == stages_.end() || it->second.state != State::kReleased) return;
    it->second.state = State::kGathering;
    it->second.error = absl::OkStatus();
  }
  comm_->Run(scope_.Wrap([this, stage] { Gather(stage); }));
}

absl::Status ParameterGathering::GatherNow(int stage) {
  absl::Status status;
  try {
    status = shards_->GatherStage(stage, *group_, timeout_);
  } catch (const c10::Error& e) {
    status = absl::InternalError(absl::StrCat("gathering the parameters of stage ", stage, ": ",
                                              e.what_without_backtrace()));
  }
  if (!status.ok()) group_->Abort();
  return status;
}

void ParameterGathering::Gather(int stage) {
  const absl::Time start = absl::Now();
  absl::Status status = GatherNow(stage);
  const absl::Time end = absl::Now();
  absl::MutexLock lock(&mu_);
  Stage& st = stages_.at(stage);
  st.state = status.ok() ? State::kGathered : State::kReleased;
  st.error = std::move(status);
  gathers_.push_back(
      GatherTiming{stage, shards_->gathered_bytes(stage), start - step_start_, end - step_start_});
}

absl::StatusOr<ParameterGathering::State> ParameterGathering::AwaitSettled(
    int stage, const std::string& where) {
  Stage& st = stages_.at(stage);
  auto settled = [&st]() { return st.state != State::kGathering; };
  const bool blocks = st.state == State::kGathering && progress_ != nullptr;
  if (blocks) progress_->BeginWait("ALL_GATHER", stage, -1, -1, 0);
  const absl::Time start = absl::Now();
  const bool done = mu_.AwaitWithTimeout(absl::Condition(&settled), timeout_);
  waited_ += absl::Now() - start;
  if (blocks) progress_->EndWait();
  if (!done) {
    group_->Abort();
    return absl::DeadlineExceededError(absl::StrCat(
        where, ": the all-gather of stage ", stage, "'s parameters did not end within ",
        absl::FormatDuration(timeout_), " (a replica of this rank is late or lost)"));
  }
  if (!st.error.ok()) {
    return absl::Status(st.error.code(), absl::StrCat(where, ": ", st.error.message()));
  }
  return st.state;
}

absl::StatusOr<absl::Duration> ParameterGathering::AwaitGathered(int stage,
                                                                 const std::string& where) {
  absl::MutexLock lock(&mu_);
  if (stages_.count(stage) == 0) return absl::ZeroDuration();
  const absl::Duration before = waited_;
  absl::StatusOr<State> state = AwaitSettled(stage, where);
  if (!state.ok()) return state.status();
  if (*state != State::kGathered) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": stage ", stage, "'s parameters are sharded (no UNSHARD since its last RESHARD)"));
  }
  return waited_ - before;
}

absl::Status ParameterGathering::Reshard(int stage, const std::string& where) {
  absl::MutexLock lock(&mu_);
  if (stages_.count(stage) == 0) return absl::OkStatus();
  absl::StatusOr<State> state = AwaitSettled(stage, where);
  if (!state.ok()) return state.status();
  if (*state != State::kGathered) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": stage ", stage, "'s parameters are not gathered (no UNSHARD)"));
  }
  shards_->ReleaseStage(stage);
  stages_.at(stage).state = State::kReleased;
  return absl::OkStatus();
}

std::function<void()> ParameterGathering::Placeholders(int stage) {
  absl::MutexLock lock(&mu_);
  auto it = stages_.find(stage);
  if (it == stages_.end() || it->second.state != State::kReleased) return [] {};
  return FillEmptyWithZeros(shards_->ShapesOf(stage));
}

absl::Status ParameterGathering::GatherAll() {
  absl::MutexLock lock(&mu_);
  for (auto& [s, st] : stages_) {
    if (st.state != State::kReleased) continue;
    RETURN_IF_ERROR(GatherNow(s));
    st.state = State::kGathered;
  }
  return absl::OkStatus();
}

void ParameterGathering::ReleaseAll() {
  absl::MutexLock lock(&mu_);
  for (auto& [s, st] : stages_) {
    if (st.state != State::kGathered) continue;
    shards_->ReleaseStage(s);
    st.state = State::kReleased;
  }
}

}  // namespace stagecoach::runtime
