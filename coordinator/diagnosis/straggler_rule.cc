#include "coordinator/diagnosis/straggler_rule.h"

#include <algorithm>
#include <utility>

#include "common/schedule/action.h"

namespace stagecoach::coordinator {
namespace {

constexpr int kKeptPartialSteps = 16;

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double lower = *std::max_element(values.begin(), values.begin() + mid);
  return (lower + values[mid]) / 2;
}

}  // namespace

ComputeSample SampleStep(const std::vector<std::string>& actions,
                         const std::vector<v1::ActionTiming>& timings) {
  ComputeSample sample;
  if (actions.size() != timings.size()) return sample;
  for (size_t i = 0; i < actions.size(); ++i) {
    auto parsed = schedule::ParseAction(actions[i]);
    if (!parsed.ok() || !parsed->has_value() || !schedule::IsCompute((*parsed)->type)) continue;
    const v1::ActionTiming& t = timings[i];
    const double own = std::max<int64_t>(0, t.end_us() - t.start_us() - t.wait_us()) * 1e-6;
    sample.total += own;
    auto& [sum, count] = sample.by_kind[std::string(schedule::ActionTypeName((*parsed)->type))];
    sum += own;
    ++count;
  }
  return sample;
}

StragglerWatch::StragglerWatch(StragglerOptions options, std::vector<std::string> work_keys,
                               int num_ranks)
    : options_(options),
      keys_(std::move(work_keys)),
      num_ranks_(std::max(num_ranks, 1)),
      peers_(keys_.size()),
      pace_(keys_.size(), 0.0),
      kind_pace_(keys_.size()),
      straggling_(keys_.size(), false) {
  options_.window = std::max(options_.window, 1);
  for (size_t t = 0; t < keys_.size(); ++t) {
    for (size_t u = 0; u < keys_.size(); ++u) {
      if (u != t && keys_[u] == keys_[t]) peers_[t].push_back(static_cast<int>(u));
    }
  }
}

void StragglerWatch::Add(int64_t step, int task, ComputeSample sample) {
  if (task < 0 || task >= static_cast<int>(keys_.size()) || sample.total <= 0) return;
  partial_[step][task] = std::move(sample);
  while (static_cast<int>(partial_.size()) > kKeptPartialSteps) partial_.erase(partial_.begin());
}

std::vector<v1::StragglerEvent> StragglerWatch::Complete(int64_t step, absl::Time now) {
  std::vector<v1::StragglerEvent> changes;
  auto it = partial_.find(step);
  if (it == partial_.end()) return changes;
  const std::map<int, ComputeSample> samples = std::move(it->second);
  partial_.erase(partial_.begin(), std::next(it));
  StepRatios ratios;
  ratios.completed = now;
  for (const auto& [task, sample] : samples) {
    std::vector<double> peer_totals;
    std::map<std::string, std::vector<double>> peer_kinds;
    for (int peer : peers_[task]) {
      auto p = samples.find(peer);
      if (p == samples.end()) continue;
      peer_totals.push_back(p->second.total);
      for (const auto& [kind, sum_count] : p->second.by_kind) {
        peer_kinds[kind].push_back(sum_count.first / sum_count.second);
      }
    }
    const double median = Median(peer_totals);
    if (median <= 0) continue;
    ratios.total[task] = sample.total / median;
    for (const auto& [kind, sum_count] : sample.by_kind) {
      const double peer_mean = Median(peer_kinds[kind]);
      if (peer_mean > 0)
        ratios.by_kind[task][kind] = sum_count.first / sum_count.second / peer_mean;
    }
  }
  window_.push_back(std::move(ratios));
  if (first_completed_ == absl::InfinitePast()) first_completed_ = now;
  // The latest `window` steps, and any older ones completed within min_window.
  while (static_cast<int>(window_.size()) > kMaxWindowSteps ||
         (static_cast<int>(window_.size()) > options_.window &&
          window_.front().completed < now - options_.min_window)) {
    window_.pop_front();
  }
  const bool full = static_cast<int>(window_.size()) >= options_.window &&
                    now - first_completed_ >= options_.min_window;
  for (int task = 0; task < static_cast<int>(keys_.size()); ++task) Judge(task, full, changes);
  return changes;
}

void StragglerWatch::Judge(int task, bool full, std::vector<v1::StragglerEvent>& changes) {
  std::vector<double> totals;
  std::map<std::string, std::vector<double>> kinds;
  for (const StepRatios& step : window_) {
    auto t = step.total.find(task);
    if (t != step.total.end()) totals.push_back(t->second);
    auto k = step.by_kind.find(task);
    if (k == step.by_kind.end()) continue;
    for (const auto& [kind, ratio] : k->second) kinds[kind].push_back(ratio);
  }
  pace_[task] = Median(totals);
  kind_pace_[task].clear();
  for (auto& [kind, values] : kinds) kind_pace_[task][kind] = Median(std::move(values));
  full = full && static_cast<int>(totals.size()) >= options_.window;
  bool now = straggling_[task];
  if (!now && full && pace_[task] >= options_.threshold) now = true;
  if (now && pace_[task] < 1.0 + (options_.threshold - 1.0) / 2) now = false;
  if (now == straggling_[task]) return;
  straggling_[task] = now;
  v1::StragglerEvent event;
  *event.mutable_straggler() = Describe(task);
  event.set_straggling(now);
  changes.push_back(std::move(event));
}

v1::RankStraggler StragglerWatch::Describe(int task) const {
  v1::RankStraggler out;
  out.set_rank(task % num_ranks_);
  out.set_replica(task / num_ranks_);
  out.set_ratio(pace_[task]);
  for (const auto& [kind, ratio] : kind_pace_[task]) (*out.mutable_kind_ratios())[kind] = ratio;
  for (int peer : peers_[task]) out.add_peer_tasks(peer);
  out.set_window_steps(static_cast<int>(window_.size()));
  return out;
}

std::vector<v1::RankStraggler> StragglerWatch::Stragglers() const {
  std::vector<v1::RankStraggler> out;
  for (int task = 0; task < static_cast<int>(keys_.size()); ++task) {
    if (straggling_[task]) out.push_back(Describe(task));
  }
  return out;
}

std::vector<v1::RankPace> StragglerWatch::Pace() const {
  std::vector<v1::RankPace> out;
  for (int task = 0; task < static_cast<int>(keys_.size()); ++task) {
    if (peers_[task].empty()) continue;
    v1::RankPace pace;
    pace.set_rank(task % num_ranks_);
    pace.set_replica(task / num_ranks_);
    pace.set_ratio(pace_[task]);
    pace.set_straggling(straggling_[task]);
    out.push_back(std::move(pace));
  }
  return out;
}

}  // namespace stagecoach::coordinator
