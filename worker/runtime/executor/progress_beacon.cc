#include "worker/runtime/executor/progress_beacon.h"

#include <utility>

namespace stagecoach::runtime {
namespace {

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

}  // namespace

ProgressBeacon::ProgressBeacon(std::string job_id, int attempt, int rank, int replica,
                               std::function<absl::Time()> now)
    : now_(std::move(now)) {
  absl::MutexLock lock(&mu_);
  identity_.set_job_id(std::move(job_id));
  identity_.set_attempt(attempt);
  identity_.set_rank(rank);
  identity_.set_replica(replica);
  phase_start_ = now_();
  recent_.reserve(kRecentActions);
}

void ProgressBeacon::BeginStep(int64_t global_step) {
  const absl::Time now = now_();
  absl::MutexLock lock(&mu_);
  step_ = global_step;
  phase_ = v1::RANK_PHASE_ACTIONS;
  phase_start_ = now;
  step_start_ = now;
  action_.clear();
  waiting_ = false;
}

void ProgressBeacon::SetPhase(v1::RankPhase phase, int64_t next_step) {
  const absl::Time now = now_();
  absl::MutexLock lock(&mu_);
  if (phase == phase_ && next_step < 0) return;
  phase_ = phase;
  phase_start_ = now;
  if (next_step >= 0) step_ = next_step;
  if (phase == v1::RANK_PHASE_BETWEEN_STEPS || phase == v1::RANK_PHASE_SETUP) step_start_.reset();
  action_.clear();
  waiting_ = false;
}

void ProgressBeacon::BeginAction(const std::string& action) {
  const absl::Time now = now_();
  absl::MutexLock lock(&mu_);
  action_ = action;
  action_start_ = now;
  waiting_ = false;
}

void ProgressBeacon::EndAction(absl::Duration wait) {
  const absl::Time now = now_();
  absl::MutexLock lock(&mu_);
  if (action_.empty()) return;
  Finished done{step_, std::move(action_), now, now - action_start_, wait};
  action_.clear();
  waiting_ = false;
  if (recent_.size() < static_cast<size_t>(kRecentActions)) {
    recent_.push_back(std::move(done));
  } else {
    recent_[next_] = std::move(done);
  }
  next_ = (next_ + 1) % kRecentActions;
}

void ProgressBeacon::BeginWait(const char* kind, int stage, int microbatch, int peer,
                               uint64_t tag) {
  const absl::Time now = now_();
  absl::MutexLock lock(&mu_);
  waiting_ = true;
  wait_start_ = now;
  wait_.set_kind(kind);
  wait_.set_stage(stage);
  wait_.set_microbatch(microbatch);
  wait_.set_peer_rank(peer);
  wait_.set_tag(tag);
}

void ProgressBeacon::EndWait() {
  absl::MutexLock lock(&mu_);
  waiting_ = false;
}

v1::RankProgress ProgressBeacon::Read() const {
  const absl::Time now = now_();
  absl::MutexLock lock(&mu_);
  v1::RankProgress out = identity_;
  out.set_global_step(step_);
  out.set_phase(phase_);
  out.set_phase_elapsed_us(Micros(now - phase_start_));
  if (step_start_.has_value()) out.set_step_elapsed_us(Micros(now - *step_start_));
  if (!action_.empty()) {
    out.set_action(action_);
    out.set_action_elapsed_us(Micros(now - action_start_));
  }
  if (waiting_) {
    *out.mutable_wait() = wait_;
    out.mutable_wait()->set_waited_us(Micros(now - wait_start_));
  }
  // Oldest first: the ring's entries from next_ on, then those before it.
  const size_t n = recent_.size();
  const size_t first = n < static_cast<size_t>(kRecentActions) ? 0 : next_;
  for (size_t i = 0; i < n; ++i) {
    const Finished& f = recent_[(first + i) % n];
    v1::RecentAction* r = out.add_recent();
    r->set_global_step(f.step);
    r->set_action(f.action);
    r->set_ended_us_ago(Micros(now - f.end));
    r->set_duration_us(Micros(f.duration));
    r->set_wait_us(Micros(f.wait));
  }
  return out;
}

}  // namespace stagecoach::runtime
