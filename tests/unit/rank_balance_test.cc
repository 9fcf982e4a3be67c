// The per-rank balance GetJob shows (coordinator/jobs/rank_balance.h): a step whose reports
// come from the schedule simulator itself replays to the simulator's own bubbles and busy
// times, whatever the ranks reported as their measured bubble; waits for data are not counted
// as work; overlapped actions share their time; a missing rank or a plan without action lists
// is said so; and BalanceToProto carries the plan's prediction beside the measurement.
#include "coordinator/jobs/rank_balance.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/simulator.h"
#include "common/spec/spec_parser.h"
#include "coordinator/planning/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator::rank_balance_test {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pointwise;

Plan PlanFor(const std::string& schedule, int stages) {
  auto spec = spec::ParseJobSpec(
      absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [8, 64, 64, 64, 64, 64, 64, "
                   "64, 8]}}\nsplit: {stages: ",
                   stages, ", policy: equal-layers}\nschedule: ", schedule,
                   "\nplacement: {workers: 2}\ntraining: {batch_size: 16}\n"),
      "t");
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto plan = PlanJob(*spec);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// The reports a step would make if it ran exactly as `sim` says under `costs` (times in
// seconds): an OVERLAP_F_B that spans more than its parts' costs waited for the rest.
std::map<int, RankStepTiming> ReportsOf(const schedule::Simulation& sim,
                                        const schedule::CostModel& costs) {
  std::map<int, RankStepTiming> out;
  for (size_t r = 0; r < sim.timeline.size(); ++r) {
    RankStepTiming& t = out[static_cast<int>(r)];
    t.rank = static_cast<int>(r);
    t.bubble_ratio = 0.9;  // whatever the rank measured: the replay does not use it
    for (const schedule::TimedAction& a : sim.timeline[r]) {
      t.actions.push_back(a.action.ToString());
      v1::ActionTiming& timing = t.timings.emplace_back();
      timing.set_start_us(static_cast<int64_t>(a.start * 1e6));
      timing.set_end_us(static_cast<int64_t>(a.end * 1e6));
      if (a.action.type == schedule::ActionType::kOverlapFB) {
        double own = 0;
        for (const schedule::Action& sub : a.action.sub_actions) {
          const schedule::StageCosts& c = costs.per_stage[sub.stage];
          own += sub.type == schedule::ActionType::kForward ? c.forward
                 : sub.type == schedule::ActionType::kFullBackward ? c.backward
                 : sub.type == schedule::ActionType::kBackwardInput ? c.backward_input
                                                                   : c.backward_weight;
        }
        timing.set_wait_us(timing.end_us() - timing.start_us() - static_cast<int64_t>(own * 1e6));
      }
    }
  }
  return out;
}

// Each stage costs F 1 ms + s * 0.5 ms, B twice that, I and W the halves of B.
schedule::CostModel Costs(int stages) {
  schedule::CostModel costs;
  for (int s = 0; s < stages; ++s) {
    const double f = 1e-3 + s * 0.5e-3;
    costs.per_stage.push_back({f, 2 * f, f, f});
  }
  return costs;
}

TEST(ReplayStep, AStepThatRanAsSimulatedReplaysToTheSimulatorsBubbles) {
  for (const auto& [schedule, stages] :
       {std::pair{std::string("{kind: ZBVZeroBubble, microbatches: 4}"), 4},
        std::pair{std::string("{kind: Interleaved1F1B, microbatches: 4}"), 4},
        std::pair{std::string("{kind: 1F1B, microbatches: 4}"), 2},
        std::pair{std::string("{kind: DualPipeV, microbatches: 4}"), 4}}) {
    const Plan plan = PlanFor(schedule, stages);
    const schedule::CostModel costs = Costs(plan.num_stages);
    auto sim = schedule::Simulate(plan.lowered, plan.stage_to_rank, plan.num_stages,
                                  plan.num_microbatches, costs);
    ASSERT_TRUE(sim.ok()) << schedule << ": " << sim.status();
    auto replayed = ReplayStep(plan, 7, ReportsOf(*sim, costs));
    ASSERT_TRUE(replayed.ok()) << schedule << ": " << replayed.status();
    EXPECT_EQ(replayed->step, 7);
    EXPECT_THAT(replayed->simulated_bubble, Pointwise(DoubleNear(1e-3), sim->bubble_ratio))
        << schedule;
    EXPECT_THAT(replayed->compute_seconds, Pointwise(DoubleNear(1e-5), sim->busy)) << schedule;
    EXPECT_THAT(replayed->measured_bubble, ElementsAre(0.9, 0.9));
  }
}

TEST(ReplayStep, WaitsAreNotWorkAndAMissingRankIsSaidSo) {
  const Plan plan = PlanFor("{kind: 1F1B, microbatches: 4}", 2);
  const schedule::CostModel costs = Costs(2);
  auto sim = schedule::Simulate(plan.lowered, plan.stage_to_rank, plan.num_stages,
                                plan.num_microbatches, costs);
  ASSERT_TRUE(sim.ok());
  std::map<int, RankStepTiming> reports = ReportsOf(*sim, costs);
  // Rank 1's actions each waited 0.5 ms longer for their data: their own work is unchanged.
  for (v1::ActionTiming& t : reports[1].timings) {
    if (t.end_us() > t.start_us()) {
      t.set_end_us(t.end_us() + 500);
      t.set_wait_us(500);
    }
  }
  auto replayed = ReplayStep(plan, 0, reports);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_THAT(replayed->compute_seconds, Pointwise(DoubleNear(1e-5), sim->busy));

  reports.erase(1);
  auto missing = ReplayStep(plan, 3, reports);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("rank 1 did not report"));

  Plan described = plan;  // as rebuilt from a record: no action lists yet
  described.lowered.clear();
  EXPECT_EQ(ReplayStep(described, 0, ReportsOf(*sim, costs)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ReplayStep, AnOverlappedActionsTimeIsSharedByItsPartsSeparateMeans) {
  // Rank 0 reports 0F0 (2 ms), an OVERLAP_F_B of (0F1; 0B0) (9 ms) and 0B1 (4 ms): the overlap
  // is shared as F 3 ms and B 6 ms (the separate means' 2:4), so stage 0 costs F 2.5 ms and
  // B 5 ms; rank 1 reports 1F0 (1 ms) only (its B then costs I + W, 0).
  Plan plan = PlanFor("{kind: 1F1B, microbatches: 2}", 2);
  std::map<int, RankStepTiming> reports;
  RankStepTiming& r0 = reports[0];
  r0.actions = {"0F0", "(0F1;0B0)OVERLAP_F_B", "0B1"};
  for (auto [start, end] : {std::pair{0, 2000}, std::pair{2000, 11000}, std::pair{11000, 15000}}) {
    v1::ActionTiming& t = r0.timings.emplace_back();
    t.set_start_us(start);
    t.set_end_us(end);
  }
  RankStepTiming& r1 = reports[1];
  r1.actions = {"1F0"};
  r1.timings.emplace_back().set_end_us(1000);
  auto replayed = ReplayStep(plan, 0, reports);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_NEAR(replayed->compute_seconds[0], 15e-3, 1e-9);
  EXPECT_NEAR(replayed->compute_seconds[1], 1e-3, 1e-9);
  schedule::CostModel shared;
  shared.per_stage = {{2.5e-3, 5e-3, 0, 0}, {1e-3, 0, 0, 0}};
  auto sim = schedule::Simulate(plan.lowered, plan.stage_to_rank, plan.num_stages,
                                plan.num_microbatches, shared);
  ASSERT_TRUE(sim.ok());
  EXPECT_THAT(replayed->simulated_bubble, Pointwise(DoubleNear(1e-9), sim->bubble_ratio));
}

TEST(BalanceToProto, ThePredictionBesideTheMeasurement) {
  const Plan plan = PlanFor("{kind: ZBVZeroBubble, microbatches: 4}", 4);
  ASSERT_EQ(plan.predicted_ranks.size(), 2u);
  EXPECT_FALSE(plan.predicted_in_seconds);  // not profiled: shares of the step's compute
  EXPECT_NEAR(plan.predicted_ranks[0].compute + plan.predicted_ranks[1].compute, 1.0, 1e-9);

  v1::Job before;
  BalanceToProto(plan, MeasuredBalance{}, &before);
  EXPECT_EQ(before.balance_step(), -1);
  ASSERT_EQ(before.balance_size(), 2);
  EXPECT_THAT(before.balance(0).stages(), ElementsAre(0, 3));  // the V
  EXPECT_THAT(before.balance(1).stages(), ElementsAre(1, 2));
  EXPECT_DOUBLE_EQ(before.balance(1).predicted_bubble_ratio(),
                   plan.predicted_ranks[1].bubble_ratio);
  EXPECT_EQ(before.balance(0).measured_compute_seconds(), 0);

  MeasuredBalance measured{12, {0.010, 0.012}, {0.3, 0.2}, {0.25, 0.15}};
  v1::Job after;
  BalanceToProto(plan, measured, &after);
  EXPECT_EQ(after.balance_step(), 12);
  EXPECT_DOUBLE_EQ(after.balance(1).measured_compute_seconds(), 0.012);
  EXPECT_DOUBLE_EQ(after.balance(0).measured_bubble_ratio(), 0.3);
  EXPECT_DOUBLE_EQ(after.balance(0).simulated_bubble_ratio(), 0.25);
}

}  // namespace
}  // namespace stagecoach::coordinator::rank_balance_test
