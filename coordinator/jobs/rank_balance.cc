#include "coordinator/jobs/rank_balance.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/schedule/action.h"
#include "common/schedule/simulator.h"
#include "common/util/status_macros.h"

namespace stagecoach::coordinator {
namespace {

// Sums and counts of one stage's measured action times, by kind.
struct StageSamples {
  enum Kind { kF, kB, kI, kW, kKinds };
  std::array<double, kKinds> sum{};
  std::array<int, kKinds> count{};

  double Mean(Kind k) const { return count[k] > 0 ? sum[k] / count[k] : 0.0; }
};

int KindOf(schedule::ActionType type) {
  switch (type) {
    case schedule::ActionType::kForward:
      return StageSamples::kF;
    case schedule::ActionType::kFullBackward:
      return StageSamples::kB;
    case schedule::ActionType::kBackwardInput:
      return StageSamples::kI;
    case schedule::ActionType::kBackwardWeight:
      return StageSamples::kW;
    default:
      return -1;
  }
}

// How a stage's kinds of action compare when only some were measured apart: F 1, B 2, I 1, W 1.
double Ratio(StageSamples::Kind k) { return k == StageSamples::kB ? 2.0 : 1.0; }

// A stage's time for one unit of Ratio: from its separately measured actions; nullopt when it
// ran none apart.
std::optional<double> Unit(const StageSamples& st) {
  for (int k = 0; k < StageSamples::kKinds; ++k) {
    if (st.count[k] > 0) return st.Mean(StageSamples::Kind(k)) / Ratio(StageSamples::Kind(k));
  }
  return std::nullopt;
}

// A kind's weight when an overlapped action's time is shared: its separate mean, else its ratio
// times the stage's unit (or `fallback_unit`, the mean unit of the stages that have one).
double Weight(const StageSamples& st, StageSamples::Kind k, double fallback_unit) {
  if (st.count[k] > 0) return st.Mean(k);
  return Ratio(k) * Unit(st).value_or(fallback_unit);
}

}  // namespace

absl::StatusOr<MeasuredBalance> ReplayStep(const Plan& plan, int64_t step,
                                           const std::map<int, RankStepTiming>& ranks) {
  MeasuredBalance out;
  out.step = step;
  if (plan.lowered.size() != static_cast<size_t>(plan.num_ranks) ||
      plan.stage_to_rank.size() != static_cast<size_t>(plan.num_stages)) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, ": the job's plan has no action lists to replay yet"));
  }
  std::vector<StageSamples> stages(plan.num_stages);
  struct Overlap {
    std::vector<std::pair<int, int>> parts;  // (stage, kind)
    double seconds = 0;
  };
  std::vector<Overlap> overlaps;
  for (int r = 0; r < plan.num_ranks; ++r) {
    auto it = ranks.find(r);
    if (it == ranks.end()) {
      return absl::NotFoundError(absl::StrCat("step ", step, ": rank ", r, " did not report it"));
    }
    const RankStepTiming& timing = it->second;
    if (timing.timings.size() != timing.actions.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step, " rank ", r, ": ", timing.actions.size(), " actions but ",
                       timing.timings.size(), " timings"));
    }
    double busy = 0;
    for (size_t i = 0; i < timing.actions.size(); ++i) {
      auto parsed = schedule::ParseRequiredAction(timing.actions[i]);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("step ", step, " rank ", r, " action ", i,
                                                       ": ", parsed.status().message()));
      }
      const v1::ActionTiming& t = timing.timings[i];
      const double own = std::max<int64_t>(0, t.end_us() - t.start_us() - t.wait_us()) * 1e-6;
      if (parsed->type == schedule::ActionType::kOverlapFB) {
        Overlap o;
        o.seconds = own;
        for (const schedule::Action& sub : parsed->sub_actions) {
          const int kind = KindOf(sub.type);
          if (kind >= 0 && sub.stage >= 0 && sub.stage < plan.num_stages) {
            o.parts.emplace_back(sub.stage, kind);
          }
        }
        overlaps.push_back(std::move(o));
        busy += own;
        continue;
      }
      const int kind = KindOf(parsed->type);
      if (kind < 0 || parsed->stage < 0 || parsed->stage >= plan.num_stages) continue;
      stages[parsed->stage].sum[kind] += own;
      ++stages[parsed->stage].count[kind];
      busy += own;
    }
    out.compute_seconds.push_back(busy);
    out.measured_bubble.push_back(timing.bubble_ratio);
  }
  // Overlapped time, shared among its parts by their separate means (taken before any sharing).
  const std::vector<StageSamples> separate = stages;
  double units = 0;
  int with_unit = 0;
  for (const StageSamples& st : separate) {
    if (std::optional<double> u = Unit(st)) {
      units += *u;
      ++with_unit;
    }
  }
  const double fallback_unit = with_unit > 0 ? units / with_unit : 1.0;
  for (const Overlap& o : overlaps) {
    double weights = 0;
    for (auto [s, k] : o.parts) weights += Weight(separate[s], StageSamples::Kind(k), fallback_unit);
    for (auto [s, k] : o.parts) {
      const double w = Weight(separate[s], StageSamples::Kind(k), fallback_unit);
      stages[s].sum[k] += weights > 0 ? o.seconds * w / weights : 0.0;
      ++stages[s].count[k];
    }
  }
  schedule::CostModel costs;
  for (const StageSamples& st : stages) {
    schedule::StageCosts c;
    c.forward = st.Mean(StageSamples::kF);
    c.backward_input = st.Mean(StageSamples::kI);
    c.backward_weight = st.Mean(StageSamples::kW);
    c.backward = st.count[StageSamples::kB] > 0 ? st.Mean(StageSamples::kB)
                                                : c.backward_input + c.backward_weight;
    costs.per_stage.push_back(c);
  }
  auto sim =
      schedule::Simulate(plan.lowered, plan.stage_to_rank, plan.num_stages, plan.num_microbatches,
                         costs);
  if (!sim.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step, ": replaying the plan failed: ", sim.status().message()));
  }
  out.simulated_bubble = sim->bubble_ratio;
  return out;
}

void BalanceToProto(const Plan& plan, const MeasuredBalance& measured, v1::Job* out) {
  out->set_predicted_compute_in_seconds(plan.predicted_in_seconds);
  out->set_balance_step(measured.compute_seconds.empty() ? -1 : measured.step);
  for (int r = 0; r < plan.num_ranks; ++r) {
    v1::RankBalance* b = out->add_balance();
    b->set_rank(r);
    // (A plan rebuilt from a record alone has no placement until it is planned again.)
    for (size_t s = 0; s < plan.stage_to_rank.size(); ++s) {
      if (plan.stage_to_rank[s] == r) b->add_stages(static_cast<int>(s));
    }
    if (static_cast<size_t>(r) < plan.predicted_ranks.size()) {
      b->set_predicted_compute(plan.predicted_ranks[r].compute);
      b->set_predicted_bubble_ratio(plan.predicted_ranks[r].bubble_ratio);
    }
    if (measured.step >= 0 && static_cast<size_t>(r) < measured.compute_seconds.size()) {
      b->set_measured_compute_seconds(measured.compute_seconds[r]);
      b->set_measured_bubble_ratio(measured.measured_bubble[r]);
      if (static_cast<size_t>(r) < measured.simulated_bubble.size()) {
        b->set_simulated_bubble_ratio(measured.simulated_bubble[r]);
      }
    }
  }
}

}  // namespace stagecoach::coordinator
