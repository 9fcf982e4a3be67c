#include "coordinator/jobs/replica_health.h"

#include <algorithm>

namespace stagecoach::coordinator {

std::map<int, std::vector<int>> AssignSlices(int replicas, const std::set<int>& lost) {
  std::map<int, std::vector<int>> slices;
  std::vector<int> healthy;
  for (int r = 0; r < replicas; ++r) {
    if (lost.count(r) == 0) {
      healthy.push_back(r);
      slices[r].push_back(r);
    }
  }
  if (healthy.empty()) return {};
  size_t next = 0;
  for (int r : lost) {
    if (r < 0 || r >= replicas) continue;
    slices[healthy[next]].push_back(r);
    next = (next + 1) % healthy.size();
  }
  for (auto& [replica, list] : slices) std::sort(list.begin(), list.end());
  return slices;
}

void ReplicaHealth::Reset(int replicas, int ranks, bool carry_on) {
  carry_on_ = carry_on;
  replicas_ = std::max(replicas, 1);
  ranks_ = std::max(ranks, 1);
  epoch_ = 0;
  lost_.clear();
  last_committed_ = -1;
  rounds_.clear();
  healing_ = -1;
  heals_ = 0;
  joiners_ready_.clear();
  join_step_ = -1;
  donor_ = -1;
}

int ReplicaHealth::ReplicaToHeal() const {
  if (!carry_on_ || healing_ >= 0 || lost_.empty()) return -1;
  return *lost_.begin();
}

void ReplicaHealth::BeginHeal(int replica) {
  healing_ = replica;
  ++heals_;
  joiners_ready_.clear();
}

bool ReplicaHealth::JoinerReady(int rank) {
  joiners_ready_.insert(rank);
  return static_cast<int>(joiners_ready_.size()) == ranks_;
}

void ReplicaHealth::AbandonHeal() {
  healing_ = -1;
  joiners_ready_.clear();
}

std::vector<int> ReplicaHealth::HealthyReplicas() const {
  std::vector<int> out;
  for (int r = 0; r < replicas_; ++r) {
    if (!IsLost(r)) out.push_back(r);
  }
  return out;
}

std::vector<int> ReplicaHealth::SlicesOf(int replica) const {
  const std::map<int, std::vector<int>> slices = AssignSlices(replicas_, lost_);
  auto it = slices.find(replica);
  return it == slices.end() ? std::vector<int>{} : it->second;
}

bool ReplicaHealth::CanLose(int replica) const {
  return replica >= 0 && replica < replicas_ && !IsLost(replica) && healthy() > 1;
}

void ReplicaHealth::Lose(int replica) {
  lost_.insert(replica);
  ++epoch_;
  rounds_.clear();
  join_step_ = -1;
  donor_ = -1;
  if (healing_ == replica) AbandonHeal();
}

ReplicaHealth::Answer ReplicaHealth::AnswerFor(int epoch, int64_t global_step) const {
  if (global_step <= last_committed_) return Answer::kCommit;
  if (epoch < epoch_) return Answer::kRetry;
  return Answer::kPending;
}

ReplicaHealth::Answer ReplicaHealth::Arrive(const Arrival& arrival,
                                            std::map<int, std::vector<double>>* committed,
                                            int64_t rejoin_before) {
  const Answer answer = AnswerFor(arrival.epoch, arrival.global_step);
  if (answer != Answer::kPending || arrival.failed || IsLost(arrival.replica) ||
      arrival.epoch != epoch_) {
    return answer;
  }
  Round& round = rounds_[arrival.global_step];
  round.tasks.insert(arrival.replica * ranks_ + arrival.rank);
  const size_t m = arrival.slices.empty() ? 0 : arrival.losses.size() / arrival.slices.size();
  for (size_t i = 0; i < arrival.slices.size() && m > 0; ++i) {
    round.losses[arrival.slices[i]].assign(arrival.losses.begin() + i * m,
                                           arrival.losses.begin() + (i + 1) * m);
  }
  if (static_cast<int>(round.tasks.size()) < healthy() * ranks_) return Answer::kPending;
  last_committed_ = arrival.global_step;
  if (committed != nullptr) *committed = std::move(round.losses);
  rounds_.erase(rounds_.begin(), rounds_.upper_bound(arrival.global_step));
  if (healing_ >= 0 && static_cast<int>(joiners_ready_.size()) == ranks_ &&
      arrival.global_step + 1 < rejoin_before) {
    // The healed replica runs with the others from the next step; the lowest other healthy
    // replica sends it the state.
    donor_ = HealthyReplicas().front();
    lost_.erase(healing_);
    join_step_ = arrival.global_step + 1;
    ++epoch_;
    rounds_.clear();
    healing_ = -1;
    joiners_ready_.clear();
  }
  return Answer::kCommit;
}

}  // namespace stagecoach::coordinator
