// Cost-model simulator and Chrome trace writer: hand-computed timings of small lowered schedules,
// closed-form bubble ratios of generated ones, PyTorch's lowered lists, and the trace's structure.
#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/action.h"
#include "common/schedule/chrome_trace.h"
#include "common/schedule/generators.h"
#include "common/schedule/lowering.h"
#include "common/schedule/simulator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/golden.h"

namespace stagecoach::schedule::schedule_simulator_test {
namespace {

using ::nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::ParseActions;

// Lowered GPipe, 2 ranks, 2 stages, 1 microbatch.
PipelineOrder GPipeTwoRanks() {
  return {ParseActions({"0F0", "0SEND_F0", "0RECV_B0", "0B0"}),
          ParseActions({"1RECV_F0", "1F0", "1B0", "1SEND_B0"})};
}

// (action, start, end) of each entry of a rank's timeline.
std::vector<std::tuple<std::string, double, double>> Spans(const std::vector<TimedAction>& rank) {
  std::vector<std::tuple<std::string, double, double>> out;
  for (const TimedAction& t : rank) out.emplace_back(t.action.ToString(), t.start, t.end);
  return out;
}

using Span = std::tuple<std::string, double, double>;

Simulation MustSimulate(const PipelineOrder& lowered, const std::vector<int>& stage_to_rank,
                        int num_stages, int num_microbatches, const CostModel& costs = {}) {
  auto sim = Simulate(lowered, stage_to_rank, num_stages, num_microbatches, costs);
  EXPECT_TRUE(sim.ok()) << sim.status();
  return sim.ok() ? *std::move(sim) : Simulation{};
}

// Lowered (AddSendRecv only) generated schedule with its default stage placement.
struct Generated {
  PipelineOrder lowered;
  std::vector<int> stage_to_rank;
  int num_stages = 0;
};

Generated Generate(ScheduleKind kind, int ranks, int stages_per_rank, int microbatches) {
  ScheduleConfig config{kind, ranks, stages_per_rank, microbatches};
  Generated g;
  g.num_stages = NumStages(config);
  auto compute = GenerateSchedule(config);
  EXPECT_TRUE(compute.ok()) << compute.status();
  auto map = StageToRank(g.num_stages, ranks, DefaultMappingStyle(kind));
  EXPECT_TRUE(map.ok()) << map.status();
  if (!compute.ok() || !map.ok()) return g;
  g.stage_to_rank = *map;
  auto lowered = AddSendRecv(*compute, g.stage_to_rank, g.num_stages);
  EXPECT_TRUE(lowered.ok()) << lowered.status();
  if (lowered.ok()) g.lowered = *std::move(lowered);
  return g;
}

// ---------------------------------------------------------------------------------------------
// Hand-computed schedules.

// F=1, B=2, free messages:
//   rank 0: F0 0-1, posts SEND_F0 at 1 and RECV_B0 at 1, B0 waits for the gradient: 4-6.
//   rank 1: posts RECV_F0 at 0, F0 waits for the activation (arrives 1): 1-2, B0 2-4, SEND_B0 at 4.
// Makespan 6; each rank is busy 3 of 6.
TEST(Simulate, GPipeTwoRanksOneMicrobatchByHand) {
  Simulation sim = MustSimulate(GPipeTwoRanks(), {0, 1}, 2, 1);
  EXPECT_EQ(sim.makespan, 6);
  EXPECT_THAT(Spans(sim.timeline[0]), ElementsAre(Span{"0F0", 0, 1}, Span{"0SEND_F0", 1, 1},
                                                  Span{"0RECV_B0", 1, 1}, Span{"0B0", 4, 6}));
  EXPECT_THAT(Spans(sim.timeline[1]), ElementsAre(Span{"1RECV_F0", 0, 0}, Span{"1F0", 1, 2},
                                                  Span{"1B0", 2, 4}, Span{"1SEND_B0", 4, 4}));
  EXPECT_THAT(sim.busy, ElementsAre(3, 3));
  EXPECT_THAT(sim.bubble_ratio, ElementsAre(0.5, 0.5));
  EXPECT_THAT(sim.peak_activations, ElementsAre(1, 1));

  ASSERT_EQ(sim.messages.size(), 2u);
  const Message& f = sim.messages[0];
  EXPECT_EQ(f.send.ToString(), "0SEND_F0");
  EXPECT_EQ(f.recv.ToString(), "1RECV_F0");
  EXPECT_EQ(f.from_rank, 0);
  EXPECT_EQ(f.to_rank, 1);
  EXPECT_EQ(f.posted_send, 1);
  EXPECT_EQ(f.posted_recv, 0);
  EXPECT_EQ(f.start, 1);
  EXPECT_EQ(f.arrive, 1);
  const Message& b = sim.messages[1];
  EXPECT_EQ(b.send.ToString(), "1SEND_B0");
  EXPECT_EQ(b.recv.ToString(), "0RECV_B0");
  EXPECT_EQ(b.from_rank, 1);
  EXPECT_EQ(b.to_rank, 0);
  EXPECT_EQ(b.posted_send, 4);
  EXPECT_EQ(b.posted_recv, 1);
  EXPECT_EQ(b.start, 4);
  EXPECT_EQ(b.arrive, 4);
}

// Latency 0.5: the activation arrives at 1.5 (rank 1: F 1.5-2.5, B 2.5-4.5), the gradient at 5
// (rank 0: B 5-7). Both messages are on the critical path: 6 + 2 * 0.5 = 7.
TEST(Simulate, LatencyDelaysEveryMessageOnTheCriticalPath) {
  CostModel costs;
  costs.latency = 0.5;
  Simulation sim = MustSimulate(GPipeTwoRanks(), {0, 1}, 2, 1, costs);
  EXPECT_EQ(sim.makespan, 7);
  EXPECT_EQ(sim.timeline[1][1].start, 1.5);
  EXPECT_EQ(sim.timeline[0][3].start, 5);
  EXPECT_THAT(sim.bubble_ratio, ElementsAre(1 - 3.0 / 7, 1 - 3.0 / 7));
}

// 100 bytes at 100 bytes/unit add 1 per message on top of the latency: 7 + 2 = 9. With stage 1
// sending 300 bytes instead, its gradient takes 0.5 + 3: rank 1 F 2.5-3.5, B 3.5-5.5, the
// gradient arrives at 9, rank 0 B 9-11.
TEST(Simulate, BandwidthAddsBytesOverBandwidthPerMessage) {
  CostModel costs;
  costs.latency = 0.5;
  costs.bandwidth = 100;
  costs.message_bytes = 100;
  Simulation sim = MustSimulate(GPipeTwoRanks(), {0, 1}, 2, 1, costs);
  EXPECT_EQ(sim.makespan, 9);
  ASSERT_EQ(sim.messages.size(), 2u);
  EXPECT_EQ(sim.messages[0].bytes, 100);
  EXPECT_EQ(sim.messages[0].arrive, 2.5);

  costs.per_stage_message_bytes = {100, 300};
  sim = MustSimulate(GPipeTwoRanks(), {0, 1}, 2, 1, costs);
  EXPECT_EQ(sim.makespan, 11);
  ASSERT_EQ(sim.messages.size(), 2u);
  EXPECT_EQ(sim.messages[1].bytes, 300);
  EXPECT_EQ(sim.messages[1].start, 5.5);
  EXPECT_EQ(sim.messages[1].arrive, 9);

  // Bandwidth 0 is infinite: only the latency counts, whatever the size.
  costs.bandwidth = 0;
  sim = MustSimulate(GPipeTwoRanks(), {0, 1}, 2, 1, costs);
  EXPECT_EQ(sim.makespan, 7);
}

// Stage 1 with F=3, B=5: rank 0 F 0-1; rank 1 F 1-4, B 4-9; rank 0 B 9-11. Busy 3 and 8 of 11.
TEST(Simulate, PerStageCostsOverrideTheDefaults) {
  CostModel costs;
  costs.per_stage.resize(2);
  costs.per_stage[1].forward = 3;
  costs.per_stage[1].backward = 5;
  Simulation sim = MustSimulate(GPipeTwoRanks(), {0, 1}, 2, 1, costs);
  EXPECT_EQ(sim.makespan, 11);
  EXPECT_THAT(sim.busy, ElementsAre(3, 8));
  EXPECT_THAT(sim.bubble_ratio, ElementsAre(1 - 3.0 / 11, 1 - 8.0 / 11));

  // A shorter per_stage leaves the remaining stages at the defaults.
  costs.per_stage.resize(1);
  costs.defaults.forward = 2;
  sim = MustSimulate(GPipeTwoRanks(), {0, 1}, 2, 1, costs);
  // Stage 0 F=1 B=2 (its own entry), stage 1 F=2 B=2: 1 + 2 + 2 + 2 = 7.
  EXPECT_EQ(sim.makespan, 7);
}

// Rank 1 runs a 3-unit UNSHARD before posting RECV_F0, so the activation sent at 1 starts
// moving at 3 and arrives at 3.5 (latency 0.5): rank 1 F 3.5-4.5, B 4.5-6.5; the gradient arrives
// at 7; rank 0 B 7-9. Makespan 9.
TEST(Simulate, LateReceiveDelaysTheTransferStart) {
  CostModel costs;
  costs.latency = 0.5;
  costs.unshard = 3;
  PipelineOrder lowered = {ParseActions({"0F0", "0SEND_F0", "0RECV_B0", "0B0"}),
                           ParseActions({"1UNSHARD", "1RECV_F0", "1F0", "1B0", "1SEND_B0"})};
  Simulation sim = MustSimulate(lowered, {0, 1}, 2, 1, costs);
  EXPECT_EQ(sim.makespan, 9);
  ASSERT_EQ(sim.messages.size(), 2u);
  EXPECT_EQ(sim.messages[0].posted_send, 1);
  EXPECT_EQ(sim.messages[0].posted_recv, 3);
  EXPECT_EQ(sim.messages[0].start, 3);
  EXPECT_EQ(sim.messages[0].arrive, 3.5);
  EXPECT_THAT(Spans(sim.timeline[1]),
              ElementsAre(Span{"1UNSHARD", 0, 3}, Span{"1RECV_F0", 3, 3}, Span{"1F0", 3.5, 4.5},
                          Span{"1B0", 4.5, 6.5}, Span{"1SEND_B0", 6.5, 6.5}));
  EXPECT_THAT(sim.busy, ElementsAre(3, 6));
}

PipelineOrder GPipeTwoRanksWithMemoryActions() {
  return {
      ParseActions({"0UNSHARD", "0F0", "0SEND_F0", "0RECV_B0", "0B0", "0REDUCE_GRAD", "0RESHARD"}),
      ParseActions({"1UNSHARD", "1RECV_F0", "1F0", "1B0", "1SEND_B0", "1REDUCE_GRAD", "1RESHARD"})};
}

TEST(Simulate, UnshardReshardAndReduceGradCostNothingByDefault) {
  Simulation sim = MustSimulate(GPipeTwoRanksWithMemoryActions(), {0, 1}, 2, 1);
  EXPECT_EQ(sim.makespan, 6);
  EXPECT_THAT(Spans(sim.timeline[0]),
              ElementsAre(Span{"0UNSHARD", 0, 0}, Span{"0F0", 0, 1}, Span{"0SEND_F0", 1, 1},
                          Span{"0RECV_B0", 1, 1}, Span{"0B0", 4, 6}, Span{"0REDUCE_GRAD", 6, 6},
                          Span{"0RESHARD", 6, 6}));
  EXPECT_THAT(sim.bubble_ratio, ElementsAre(0.5, 0.5));
}

// UNSHARD 0.25, RESHARD 0.5, REDUCE_GRAD 1:
//   rank 0: UNSHARD 0-0.25, F 0.25-1.25, SEND_F0 at 1.25.
//   rank 1: UNSHARD 0-0.25, RECV_F0 at 0.25, F 1.25-2.25, B 2.25-4.25, SEND_B0 at 4.25,
//           REDUCE_GRAD 4.25-5.25, RESHARD 5.25-5.75.
//   rank 0: B 4.25-6.25, REDUCE_GRAD 6.25-7.25, RESHARD 7.25-7.75.
// Each rank is busy 0.25 + 1 + 2 + 1 + 0.5 = 4.75 of 7.75.
TEST(Simulate, UnshardReshardAndReduceGradTakeTheirCost) {
  CostModel costs;
  costs.unshard = 0.25;
  costs.reshard = 0.5;
  costs.reduce_grad = 1;
  Simulation sim = MustSimulate(GPipeTwoRanksWithMemoryActions(), {0, 1}, 2, 1, costs);
  EXPECT_EQ(sim.makespan, 7.75);
  EXPECT_THAT(
      Spans(sim.timeline[1]),
      ElementsAre(Span{"1UNSHARD", 0, 0.25}, Span{"1RECV_F0", 0.25, 0.25}, Span{"1F0", 1.25, 2.25},
                  Span{"1B0", 2.25, 4.25}, Span{"1SEND_B0", 4.25, 4.25},
                  Span{"1REDUCE_GRAD", 4.25, 5.25}, Span{"1RESHARD", 5.25, 5.75}));
  EXPECT_THAT(sim.busy, ElementsAre(4.75, 4.75));
  EXPECT_DOUBLE_EQ(sim.bubble_ratio[0], 3 / 7.75);
}

// overlap_collectives, one rank of two stages, F 1, B 2: the all-gathers (3 and 1) and the
// reductions (2 each) queue on the rank's communication queue and take none of its time.
//   0UNSHARD at 0: gather 0-3; 1UNSHARD at 0: 3-4. 0F0 waits for it: 3-4; 1F0 4-5; 1B0 5-7;
//   1REDUCE_GRAD at 7: 7-9; 1RESHARD 7; 0B0 7-9; 0REDUCE_GRAD at 9: 9-11. Makespan 11, busy 6.
TEST(Simulate, OverlappedCollectivesRunOnTheRanksQueue) {
  CostModel costs;
  costs.overlap_collectives = true;
  costs.per_stage_unshard = {3, 1};
  costs.per_stage_reduce_grad = {2, 2};
  const PipelineOrder lowered = {
      ParseActions({"0UNSHARD", "1UNSHARD", "0F0", "1F0", "1B0", "1REDUCE_GRAD", "1RESHARD", "0B0",
                    "0REDUCE_GRAD", "0RESHARD"})};
  Simulation sim = MustSimulate(lowered, {0, 0}, 2, 1, costs);
  EXPECT_EQ(sim.makespan, 11);
  EXPECT_THAT(Spans(sim.timeline[0]),
              ElementsAre(Span{"0UNSHARD", 0, 0}, Span{"1UNSHARD", 0, 0}, Span{"0F0", 3, 4},
                          Span{"1F0", 4, 5}, Span{"1B0", 5, 7}, Span{"1REDUCE_GRAD", 7, 7},
                          Span{"1RESHARD", 7, 7}, Span{"0B0", 7, 9}, Span{"0REDUCE_GRAD", 9, 9},
                          Span{"0RESHARD", 9, 9}));
  EXPECT_THAT(sim.busy, ElementsAre(6));
  // Without the queue they take the rank's time: 3 + 1 + 1 + 1 + 2 + 2 + 2 + 2.
  costs.overlap_collectives = false;
  EXPECT_EQ(MustSimulate(lowered, {0, 0}, 2, 1, costs).makespan, 14);
  costs.per_stage_unshard = {1, 1, 1};
  EXPECT_THAT(std::string(Simulate(lowered, {0, 0}, 2, 1, costs).status().message()),
              HasSubstr("per_stage_unshard"));
}

// per_stage_after_step: work after a rank's last action and its queue (the all-gather after a
// ZeRO-1/2 optimizer step) ends the rank later without being busy time. Two ranks of one stage
// each, F 1, B 2, reductions of 2 on the queue: rank 0's B0 runs 4-6 and its reduction 6-8, then
// 3 more: 11 (rank 1: B0 2-4, reduction 4-6, then 0.5: 6.5); busy 3 each.
TEST(Simulate, WorkAfterTheStepEndsTheRankLaterWithoutBusyTime) {
  CostModel costs;
  costs.overlap_collectives = true;
  costs.per_stage_reduce_grad = {2, 2};
  costs.per_stage_after_step = {3, 0.5};
  const PipelineOrder lowered = {
      ParseActions({"0F0", "0SEND_F0", "0RECV_B0", "0B0", "0REDUCE_GRAD"}),
      ParseActions({"1RECV_F0", "1F0", "1B0", "1SEND_B0", "1REDUCE_GRAD"})};
  Simulation sim = MustSimulate(lowered, {0, 1}, 2, 1, costs);
  EXPECT_EQ(sim.makespan, 11);
  EXPECT_THAT(sim.busy, ElementsAre(3, 3));
  costs.per_stage_after_step = {};
  EXPECT_EQ(MustSimulate(lowered, {0, 1}, 2, 1, costs).makespan, 8);
  costs.per_stage_after_step = {1, -1};
  EXPECT_THAT(std::string(Simulate(lowered, {0, 1}, 2, 1, costs).status().message()),
              HasSubstr("per_stage_after_step[1]"));
}

// The full runtime lowering (UNSHARD/RESHARD, REDUCE_GRAD, send/recv) of generated GPipe r2 m1
// runs like the hand-written list: its extra actions cost nothing by default.
TEST(Simulate, RunsLowerScheduleOutput) {
  ScheduleConfig config{ScheduleKind::kGPipe, 2, 1, 1};
  auto compute = GenerateSchedule(config);
  ASSERT_TRUE(compute.ok()) << compute.status();
  auto lowered = LowerSchedule(*compute, {0, 1}, 2, 1);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  Simulation sim = MustSimulate(*lowered, {0, 1}, 2, 1);
  EXPECT_EQ(sim.makespan, 6);
  EXPECT_THAT(sim.busy, ElementsAre(3, 3));
}

// 2 ranks, 2 microbatches, rank 1 overlapping F1 with B0; F=1, B=2, free messages:
//   rank 0: F0 0-1, F1 1-2 (sends at 1 and 2), B0 5-7, B1 7-9.
//   rank 1: F0 1-2, (F1 2-3; B0 3-5) = 2-5, SEND_B0 at 5, B1 5-7, SEND_B1 at 7.
// Makespan 9, each rank busy 6.
TEST(Simulate, OverlapRunsItsSubActionsBackToBack) {
  PipelineOrder lowered = {
      ParseActions({"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"}),
      ParseActions(
          {"1RECV_F0", "1F0", "1RECV_F1", "(1F1;1B0)OVERLAP_F_B", "1SEND_B0", "1B1", "1SEND_B1"})};
  Simulation sim = MustSimulate(lowered, {0, 1}, 2, 2);
  EXPECT_EQ(sim.makespan, 9);
  EXPECT_THAT(Spans(sim.timeline[1]),
              ElementsAre(Span{"1RECV_F0", 0, 0}, Span{"1F0", 1, 2}, Span{"1RECV_F1", 2, 2},
                          Span{"(1F1;1B0)OVERLAP_F_B", 2, 5}, Span{"1SEND_B0", 5, 5},
                          Span{"1B1", 5, 7}, Span{"1SEND_B1", 7, 7}));
  EXPECT_THAT(Spans(sim.timeline[0]).back(), Span("0B1", 7, 9));
  EXPECT_THAT(sim.busy, ElementsAre(6, 6));
  EXPECT_DOUBLE_EQ(sim.bubble_ratio[1], 1.0 / 3);
  EXPECT_THAT(sim.peak_activations, ElementsAre(2, 2));
}

// As above with stage 0 F=4 and B0 overlapped first: rank 0 F0 0-4, F1 4-8; rank 1 F0 4-5,
// (B0 5-7; F1 waits for its activation, sent at 8: 8-9) = 5-9, B1 9-11; rank 0 B0 9-11,
// B1 11-13. The overlap spans 4 units for 3 units of work.
TEST(Simulate, OverlapSubActionWaitsForItsOwnInput) {
  PipelineOrder lowered = {
      ParseActions({"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"}),
      ParseActions(
          {"1RECV_F0", "1F0", "1RECV_F1", "(1B0;1F1)OVERLAP_F_B", "1SEND_B0", "1B1", "1SEND_B1"})};
  CostModel costs;
  costs.per_stage = {StageCosts{4, 2, 1, 1}};
  Simulation sim = MustSimulate(lowered, {0, 1}, 2, 2, costs);
  EXPECT_EQ(sim.makespan, 13);
  EXPECT_THAT(Spans(sim.timeline[1])[3], Span("(1B0;1F1)OVERLAP_F_B", 5, 9));
  EXPECT_THAT(sim.busy, ElementsAre(12, 6));
}

// Split backward: I sends the input gradient before W runs. F=1, I=1, W=1: rank 0 F 0-1;
// rank 1 F 1-2, I 2-3 (gradient sent at 3), W 3-4; rank 0 I 3-4, W 4-5. Makespan 5.
TEST(Simulate, SplitBackwardSendsTheGradientAfterI) {
  PipelineOrder lowered = {ParseActions({"0F0", "0SEND_F0", "0RECV_B0", "0I0", "0W0"}),
                           ParseActions({"1RECV_F0", "1F0", "1I0", "1SEND_B0", "1W0"})};
  Simulation sim = MustSimulate(lowered, {0, 1}, 2, 1);
  EXPECT_EQ(sim.makespan, 5);
  EXPECT_THAT(Spans(sim.timeline[0]).back(), Span("0W0", 4, 5));
}

TEST(Simulate, SplitBackwardHoldsActivationsUntilW) {
  CostModel costs;
  costs.defaults.backward_input = 0.25;
  costs.defaults.backward_weight = 0.5;
  Simulation held =
      MustSimulate({ParseActions({"0F0", "0F1", "0I0", "0I1", "0W0", "0W1"})}, {0}, 1, 2, costs);
  EXPECT_EQ(held.makespan, 3.5);
  EXPECT_THAT(held.peak_activations, ElementsAre(2));
  Simulation released =
      MustSimulate({ParseActions({"0F0", "0I0", "0W0", "0F1", "0I1", "0W1"})}, {0}, 1, 2, costs);
  EXPECT_THAT(released.peak_activations, ElementsAre(1));
  // I alone releases nothing.
  Simulation after_i =
      MustSimulate({ParseActions({"0F0", "0I0", "0F1", "0I1", "0W0", "0W1"})}, {0}, 1, 2, costs);
  EXPECT_THAT(after_i.peak_activations, ElementsAre(2));
}

// Stages 0 and 1 on one rank exchange nothing: F1 only needs F0 earlier on the rank.
TEST(Simulate, LocalProducerNeedsNoMessage) {
  Simulation sim = MustSimulate({ParseActions({"0F0", "1F0", "1B0", "0B0"})}, {0, 0}, 2, 1);
  EXPECT_EQ(sim.makespan, 6);
  EXPECT_TRUE(sim.messages.empty());
  EXPECT_THAT(sim.bubble_ratio, ElementsAre(0));
}

TEST(Simulate, IdleSlotsCostNothing) {
  PipelineOrder lowered = GPipeTwoRanks();
  lowered[0].insert(lowered[0].begin(), std::nullopt);
  lowered[1].insert(lowered[1].begin() + 2, std::nullopt);
  Simulation sim = MustSimulate(lowered, {0, 1}, 2, 1);
  EXPECT_EQ(sim.makespan, 6);
  EXPECT_EQ(sim.timeline[0].size(), 4u);
  EXPECT_EQ(sim.timeline[1].size(), 4u);
}

TEST(Simulate, EmptyScheduleHasZeroMakespan) {
  Simulation sim = MustSimulate({RankActions{}, RankActions{}}, {0, 1}, 2, 1);
  EXPECT_EQ(sim.makespan, 0);
  EXPECT_THAT(sim.busy, ElementsAre(0, 0));
  EXPECT_THAT(sim.bubble_ratio, ElementsAre(0, 0));
  EXPECT_THAT(sim.peak_activations, ElementsAre(0, 0));
}

// ---------------------------------------------------------------------------------------------
// Generated schedules.

// With F = B = 1 every rank of GPipe and 1F1B computes 2m units in a makespan of 2(m + p - 1):
// bubble (p - 1) / (m + p - 1).
TEST(Simulate, GPipeAnd1F1BBubbleRatioMatchesTheClosedForm) {
  CostModel costs;
  costs.defaults.forward = 1;
  costs.defaults.backward = 1;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = p; m <= 16; ++m) {
        SCOPED_TRACE(absl::StrCat(ScheduleKindName(kind), " p=", p, " m=", m));
        Generated g = Generate(kind, p, 1, m);
        Simulation sim = MustSimulate(g.lowered, g.stage_to_rank, g.num_stages, m, costs);
        EXPECT_EQ(sim.makespan, 2 * (m + p - 1));
        ASSERT_EQ(sim.bubble_ratio.size(), static_cast<size_t>(p));
        for (int r = 0; r < p; ++r) {
          EXPECT_NEAR(sim.bubble_ratio[r], double(p - 1) / (m + p - 1), 1e-12) << "rank " << r;
        }
      }
    }
  }
}

// With the default F=1, B=2 both take (m + p - 1)(F + B).
TEST(Simulate, GPipeAnd1F1BMakespanWithDefaultCosts) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int p : {2, 4, 8}) {
      const int m = 2 * p;
      SCOPED_TRACE(absl::StrCat(ScheduleKindName(kind), " p=", p, " m=", m));
      Generated g = Generate(kind, p, 1, m);
      Simulation sim = MustSimulate(g.lowered, g.stage_to_rank, g.num_stages, m);
      EXPECT_EQ(sim.makespan, 3 * (m + p - 1));
    }
  }
}

// GPipe holds every microbatch on every stage; 1F1B holds p - s on stage s.
TEST(Simulate, PeakActivationsOfGPipeAnd1F1B) {
  const int p = 4, m = 8;
  Generated gpipe = Generate(ScheduleKind::kGPipe, p, 1, m);
  EXPECT_THAT(MustSimulate(gpipe.lowered, gpipe.stage_to_rank, p, m).peak_activations,
              ElementsAre(8, 8, 8, 8));
  Generated one_f_one_b = Generate(ScheduleKind::k1F1B, p, 1, m);
  EXPECT_THAT(MustSimulate(one_f_one_b.lowered, one_f_one_b.stage_to_rank, p, m).peak_activations,
              ElementsAre(4, 3, 2, 1));
}

// Invariants of any simulation of `lowered`.
void ExpectConsistent(const PipelineOrder& lowered, const Simulation& sim, const CostModel& costs) {
  ASSERT_EQ(sim.timeline.size(), lowered.size());
  size_t sends = 0;
  std::map<std::string, double> arrivals;  // RECV action -> arrival
  for (const Message& m : sim.messages) {
    EXPECT_GE(m.start, m.posted_send);
    EXPECT_GE(m.start, m.posted_recv);
    EXPECT_DOUBLE_EQ(m.arrive, m.start + costs.latency);
    arrivals[m.recv.ToString()] = m.arrive;
  }
  for (size_t r = 0; r < lowered.size(); ++r) {
    size_t actions = 0;
    for (const auto& a : lowered[r]) {
      if (!a) continue;
      ++actions;
      if (a->type == ActionType::kSendF || a->type == ActionType::kSendB) ++sends;
    }
    ASSERT_EQ(sim.timeline[r].size(), actions) << "rank " << r;
    double clock = 0;
    for (const TimedAction& t : sim.timeline[r]) {
      EXPECT_GE(t.start, clock) << t.action;
      EXPECT_GE(t.end, t.start) << t.action;
      EXPECT_LE(t.end, sim.makespan) << t.action;
      clock = t.end;
      for (const Action* leaf : LeafActions(t.action)) {
        // A consumer of a remote tensor starts after it arrives.
        const char* recv = leaf->type == ActionType::kForward ? "RECV_F" : "RECV_B";
        auto it = arrivals.find(absl::StrCat(leaf->stage, recv, leaf->microbatch.value_or(0)));
        if (IsCompute(leaf->type) && leaf->type != ActionType::kBackwardWeight &&
            it != arrivals.end()) {
          EXPECT_GE(t.end, it->second) << t.action;
          if (&t.action == leaf) {
            EXPECT_GE(t.start, it->second) << t.action;
          }
        }
      }
    }
    EXPECT_LE(sim.busy[r], sim.makespan + 1e-9);
    EXPECT_GE(sim.bubble_ratio[r], -1e-12);
  }
  EXPECT_EQ(sim.messages.size(), sends);
  for (size_t i = 1; i < sim.messages.size(); ++i) {
    EXPECT_LE(sim.messages[i - 1].start, sim.messages[i].start);
  }
}

// PyTorch's own lowered lists (UNSHARD/RESHARD, REDUCE_GRAD, OVERLAP_F_B, I/W) all run.
TEST(Simulate, RunsEveryGoldenLoweredList) {
  CostModel costs;
  costs.latency = 0.25;
  costs.unshard = 0.5;
  costs.reshard = 0.5;
  costs.reduce_grad = 1;
  int checked = 0;
  for (const testing::GoldenFile& g : testing::GoldenFiles(".comms.csv")) {
    SCOPED_TRACE(g.file);
    PipelineOrder lowered = testing::LoadGoldenOrder(g.file);
    auto kind = ParseScheduleKind(g.schedule);
    ASSERT_TRUE(kind.ok()) << kind.status();
    auto map = StageToRank(g.num_stages(), g.ranks, DefaultMappingStyle(*kind));
    ASSERT_TRUE(map.ok()) << map.status();
    Simulation sim = MustSimulate(lowered, *map, g.num_stages(), g.microbatches, costs);
    ExpectConsistent(lowered, sim, costs);
    // Each rank computes F + B (or F + I + W) of m microbatches of each of its stages.
    for (int r = 0; r < g.ranks; ++r) EXPECT_GE(sim.busy[r], 3.0 * g.microbatches);
    ++checked;
  }
  EXPECT_EQ(checked, 23);
}

TEST(Simulate, RunsEveryGeneratedKind) {
  CostModel costs;
  costs.latency = 0.5;
  for (ScheduleKind kind : AllScheduleKinds()) {
    SCOPED_TRACE(ScheduleKindName(kind));
    const bool single = kind == ScheduleKind::kGPipe || kind == ScheduleKind::k1F1B;
    Generated g = Generate(kind, 4, single ? 1 : 2, 16);
    Simulation sim = MustSimulate(g.lowered, g.stage_to_rank, g.num_stages, 16, costs);
    ExpectConsistent(g.lowered, sim, costs);
  }
}

// ---------------------------------------------------------------------------------------------
// Errors.

TEST(Simulate, DeadlockNamesEveryBlockedRank) {
  // Rank 0 waits for the gradient before sending the activation rank 1 waits for.
  PipelineOrder lowered = {ParseActions({"0F0", "0RECV_B0", "0B0", "0SEND_F0"}),
                           ParseActions({"1RECV_F0", "1F0", "1B0", "1SEND_B0"})};
  auto sim = Simulate(lowered, {0, 1}, 2, 1);
  ASSERT_FALSE(sim.ok());
  EXPECT_EQ(sim.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sim.status().message(),
            "deadlock: no rank can progress; rank 0 is blocked at step 2 on 0B0, waiting for "
            "1SEND_B0 from rank 1; rank 1 is blocked at step 1 on 1F0, waiting for 0SEND_F0 from "
            "rank 0");
}

TEST(Simulate, DeadlockOnALocalProducerThatComesLater) {
  PipelineOrder lowered = {ParseActions({"1F0", "0F0"}), RankActions{}};
  auto sim = Simulate(lowered, {0, 0}, 2, 1);
  ASSERT_FALSE(sim.ok());
  EXPECT_EQ(sim.status().message(),
            "deadlock: no rank can progress; rank 0 is blocked at step 0 on 1F0, waiting for 0F0 "
            "on this rank; rank 1 has finished");
}

TEST(Simulate, DeadlockNamesTheWaitingSubAction) {
  PipelineOrder lowered = {ParseActions({"0F0", "(0F1;0B0)OVERLAP_F_B", "0SEND_F0", "0SEND_F1"}),
                           ParseActions({"1RECV_F0", "1F0", "1B0", "1SEND_B0"})};
  lowered[0].insert(lowered[0].begin() + 1, *ParseAction("0RECV_B0"));
  auto sim = Simulate(lowered, {0, 1}, 2, 2);
  ASSERT_FALSE(sim.ok());
  EXPECT_THAT(sim.status().message(),
              HasSubstr("rank 0 is blocked at step 2 on 0B0 (in (0F1;0B0)OVERLAP_F_B), waiting "
                        "for 1SEND_B0 from rank 1"));
}

TEST(Simulate, RejectsBadCostsNamingTheField) {
  struct Case {
    CostModel costs;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({CostModel{}, "costs.defaults.forward"});
  cases.back().costs.defaults.forward = -1;
  cases.push_back({CostModel{}, "costs.per_stage[1].backward_weight"});
  cases.back().costs.per_stage.resize(2);
  cases.back().costs.per_stage[1].backward_weight = std::numeric_limits<double>::quiet_NaN();
  cases.push_back({CostModel{}, "costs.latency"});
  cases.back().costs.latency = -0.5;
  cases.push_back({CostModel{}, "costs.bandwidth"});
  cases.back().costs.bandwidth = std::numeric_limits<double>::infinity();
  cases.push_back({CostModel{}, "costs.reduce_grad"});
  cases.back().costs.reduce_grad = -2;
  cases.push_back({CostModel{}, "costs.per_stage_message_bytes[0]"});
  cases.back().costs.per_stage_message_bytes = {-1};
  cases.push_back({CostModel{}, "costs.per_stage has 3 entries"});
  cases.back().costs.per_stage.resize(3);
  for (const Case& c : cases) {
    auto sim = Simulate(GPipeTwoRanks(), {0, 1}, 2, 1, c.costs);
    ASSERT_FALSE(sim.ok()) << c.field;
    EXPECT_EQ(sim.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(sim.status().message(), HasSubstr(c.field));
  }
}

TEST(Simulate, RejectsListsItCannotRun) {
  struct Case {
    PipelineOrder lowered;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{ParseActions({"0F0", "0SEND_F0", "0RECV_B0", "0B0"}),
        ParseActions({"1F0", "1B0", "1SEND_B0"})},
       "rank 1, step 0: 1F0 consumes a tensor from rank 0 but its 1RECV_F0 was not posted before "
       "it"},
      {{ParseActions({"0SEND_F0", "0F0", "0RECV_B0", "0B0"}), GPipeTwoRanks()[1]},
       "rank 0, step 0: 0SEND_F0 comes before 0F0, which produces what it sends"},
      {{ParseActions({"0F0", "0SEND_F0", "0SEND_F0"}), ParseActions({"1RECV_F0", "1F0"})},
       "rank 0, step 2: 0SEND_F0 is posted twice"},
      {{ParseActions({"0F0", "0SEND_F0"}), RankActions{}},
       "0SEND_F0 on rank 0 has no matching 1RECV_F0 on rank 1"},
      {{RankActions{}, ParseActions({"1RECV_F0"})},
       "1RECV_F0 on rank 1 has no matching 0SEND_F0 on rank 0"},
      {{ParseActions({"0F0", "0F0"}), RankActions{}}, "rank 0, step 1: 0F0 runs a second time"},
      {{RankActions{}, ParseActions({"1B0"})}, "rank 1, step 0: 1B0 runs before 1F0"},
      {{ParseActions({"0F0", "0W0"}), RankActions{}}, "rank 0, step 1: 0W0 runs before 0I0"},
      {{ParseActions({"1F0"}), RankActions{}},
       "rank 0, step 0: action 1F0 of stage 1 is on rank 0, but stage_to_rank maps stage 1 to "
       "rank 1"},
      {{ParseActions({"0F5"}), RankActions{}},
       "rank 0, step 0: action 0F5 names microbatch 5, outside [0, 1)"},
      {{ParseActions({"2F0"}), RankActions{}},
       "rank 0, step 0: action 2F0 names stage 2, outside [0, 2)"},
      {{ParseActions({"0RECV_F0"}), RankActions{}},
       "rank 0, step 0: 0RECV_F0 exchanges a tensor with stage -1, which does not exist"},
      {{ParseActions({"(0F0;0UNSHARD)OVERLAP_F_B"}), RankActions{}},
       "rank 0, step 0: (0F0;0UNSHARD)OVERLAP_F_B overlaps 0UNSHARD; OVERLAP_F_B may only contain "
       "F, I, B and W"},
  };
  for (const Case& c : cases) {
    auto sim = Simulate(c.lowered, {0, 1}, 2, 1);
    ASSERT_FALSE(sim.ok()) << c.error;
    EXPECT_EQ(sim.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(sim.status().message(), c.error);
  }
  // Stages on the same rank exchange nothing.
  auto same_rank = Simulate({ParseActions({"0F0", "0SEND_F0"})}, {0, 0}, 2, 1);
  ASSERT_FALSE(same_rank.ok());
  EXPECT_THAT(same_rank.status().message(), HasSubstr("are both on rank 0"));
}

TEST(Simulate, RejectsInconsistentShapes) {
  EXPECT_THAT(Simulate(GPipeTwoRanks(), {0}, 2, 1).status().message(),
              HasSubstr("stage_to_rank has 1 entries"));
  EXPECT_THAT(Simulate(GPipeTwoRanks(), {0, 2}, 2, 1).status().message(),
              HasSubstr("stage 1 is mapped to rank 2"));
  EXPECT_THAT(Simulate(GPipeTwoRanks(), {0, 1}, 2, 0).status().message(),
              HasSubstr("num_microbatches must be at least 1"));
}

// ---------------------------------------------------------------------------------------------
// Text summary.

TEST(FormatTimeline, SummarisesMakespanBubblesAndActivations) {
  Simulation sim = MustSimulate(GPipeTwoRanks(), {0, 1}, 2, 1);
  EXPECT_EQ(FormatTimeline(sim),
            "makespan 6\n"
            "  rank         busy   bubble\n"
            "     0            3    50.0%\n"
            "     1            3    50.0%\n"
            " stage    peak acts\n"
            "     0            1\n"
            "     1            1\n");
}

// ---------------------------------------------------------------------------------------------
// Chrome trace.

json ParseTrace(const Simulation& sim, const ChromeTraceOptions& options = {}) {
  const std::string text = FormatChromeTrace(sim.timeline, sim.messages, options);
  json trace = json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(trace.is_discarded()) << text;
  return trace;
}

std::vector<json> EventsWithPhase(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == ph) out.push_back(e);
  }
  return out;
}

// (pid, name, ts, dur) of the complete events on thread `tid`.
std::vector<std::tuple<int, std::string, double, double>> CompleteOnThread(const json& trace,
                                                                           int tid) {
  std::vector<std::tuple<int, std::string, double, double>> out;
  for (const json& e : EventsWithPhase(trace, "X")) {
    if (e["tid"] != tid) continue;
    out.emplace_back(e["pid"].get<int>(), e["name"].get<std::string>(), e["ts"].get<double>(),
                     e["dur"].get<double>());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FormatChromeTrace, GPipeTwoRanksHasTheHandComputedTimes) {
  json trace = ParseTrace(MustSimulate(GPipeTwoRanks(), {0, 1}, 2, 1));
  ASSERT_TRUE(trace.is_object());
  ASSERT_TRUE(trace["traceEvents"].is_array());
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  EXPECT_EQ(trace["otherData"]["num_ranks"], 2);
  EXPECT_EQ(trace["otherData"]["end"], 6);

  using Event = std::tuple<int, std::string, double, double>;
  // The simulator's unit is 1000 µs.
  EXPECT_THAT(CompleteOnThread(trace, 0),
              ElementsAre(Event{0, "0B0", 4000, 2000}, Event{0, "0F0", 0, 1000},
                          Event{1, "1B0", 2000, 2000}, Event{1, "1F0", 1000, 1000}));
  // Both messages are instantaneous: zero-length transfers at 1 and 4 on both ends.
  EXPECT_THAT(CompleteOnThread(trace, 1),
              ElementsAre(Event{0, "0RECV_B0", 4000, 0}, Event{0, "0SEND_F0", 1000, 0},
                          Event{1, "1RECV_F0", 1000, 0}, Event{1, "1SEND_B0", 4000, 0}));
  std::vector<std::tuple<int, std::string, double>> posts;
  for (const json& e : EventsWithPhase(trace, "i")) {
    EXPECT_EQ(e["tid"], 1);
    EXPECT_EQ(e["cat"], "communication");
    posts.emplace_back(e["pid"].get<int>(), e["name"].get<std::string>(), e["ts"].get<double>());
  }
  std::sort(posts.begin(), posts.end());
  EXPECT_THAT(posts, ElementsAre(std::tuple<int, std::string, double>{0, "0RECV_B0", 1000},
                                 std::tuple<int, std::string, double>{0, "0SEND_F0", 1000},
                                 std::tuple<int, std::string, double>{1, "1RECV_F0", 0},
                                 std::tuple<int, std::string, double>{1, "1SEND_B0", 4000}));
  for (const json& e : EventsWithPhase(trace, "X")) {
    if (e["name"] == "1F0") {
      EXPECT_EQ(e["cat"], "compute");
      EXPECT_EQ(e["args"]["stage"], 1);
      EXPECT_EQ(e["args"]["microbatch"], 0);
      EXPECT_EQ(e["args"]["type"], "F");
    }
    if (e["name"] == "1SEND_B0") {
      EXPECT_EQ(e["args"]["peer_rank"], 0);
      EXPECT_EQ(e["args"]["type"], "SEND_B");
    }
  }
}

TEST(FormatChromeTrace, HasProcessAndThreadMetadataPerRank) {
  json trace = ParseTrace(MustSimulate(GPipeTwoRanks(), {0, 1}, 2, 1));
  std::map<std::tuple<int, std::string>, json> process;  // (pid, name) -> args
  std::map<std::tuple<int, int>, std::string> threads;   // (pid, tid) -> name
  for (const json& e : EventsWithPhase(trace, "M")) {
    if (e["name"] == "thread_name") {
      threads[{e["pid"].get<int>(), e["tid"].get<int>()}] = e["args"]["name"].get<std::string>();
    } else if (!e.contains("tid")) {
      process[{e["pid"].get<int>(), e["name"].get<std::string>()}] = e["args"];
    }
  }
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ((process[{rank, "process_name"}]["name"]), absl::StrCat("Rank ", rank));
    EXPECT_EQ((process[{rank, "process_sort_index"}]["sort_index"]), rank);
    EXPECT_EQ((threads[{rank, 0}]), "compute");
    EXPECT_EQ((threads[{rank, 1}]), "communication");
  }
  EXPECT_EQ(threads.size(), 4u);
}

TEST(FormatChromeTrace, FlowEventsPairEachSendWithItsReceive) {
  CostModel costs;
  costs.latency = 0.5;
  Simulation sim = MustSimulate(GPipeTwoRanks(), {0, 1}, 2, 1, costs);
  json trace = ParseTrace(sim);
  std::map<int, json> starts, finishes;
  for (const json& e : EventsWithPhase(trace, "s")) starts[e["id"].get<int>()] = e;
  for (const json& e : EventsWithPhase(trace, "f")) finishes[e["id"].get<int>()] = e;
  ASSERT_EQ(starts.size(), 2u);
  ASSERT_EQ(finishes.size(), 2u);
  for (const auto& [id, s] : starts) {
    ASSERT_TRUE(finishes.count(id)) << id;
    const json& f = finishes[id];
    const Message& m = sim.messages[id];
    EXPECT_EQ(s["pid"], m.from_rank);
    EXPECT_EQ(f["pid"], m.to_rank);
    EXPECT_EQ(f["bp"], "e");
    EXPECT_EQ(s["name"], f["name"]);
    // Inside both transfer events (midpoint of start..arrive).
    EXPECT_DOUBLE_EQ(s["ts"].get<double>(), 1000 * (m.start + m.arrive) / 2);
  }
  // The activation travels 1-1.5 on both ends.
  using Event = std::tuple<int, std::string, double, double>;
  EXPECT_THAT(CompleteOnThread(trace, 1),
              ElementsAre(Event{0, "0RECV_B0", 4500, 500}, Event{0, "0SEND_F0", 1000, 500},
                          Event{1, "1RECV_F0", 1000, 500}, Event{1, "1SEND_B0", 4500, 500}));
}

TEST(FormatChromeTrace, CategoriesAndOptions) {
  CostModel costs;
  costs.unshard = 0.25;
  costs.reshard = 0.5;
  costs.reduce_grad = 1;
  Simulation sim = MustSimulate(GPipeTwoRanksWithMemoryActions(), {0, 1}, 2, 1, costs);
  ChromeTraceOptions options;
  options.microseconds_per_unit = 1;
  options.title = "GPipe r2 m1";
  json trace = ParseTrace(sim, options);
  EXPECT_EQ(trace["otherData"]["title"], "GPipe r2 m1");
  EXPECT_EQ(trace["otherData"]["microseconds_per_unit"], 1);
  std::map<std::string, std::string> cat;
  for (const json& e : EventsWithPhase(trace, "X")) {
    if (e["pid"] == 0 && e["tid"] == 0)
      cat[e["name"].get<std::string>()] = e["cat"].get<std::string>();
  }
  EXPECT_EQ(cat["0UNSHARD"], "memory");
  EXPECT_EQ(cat["0RESHARD"], "memory");
  EXPECT_EQ(cat["0REDUCE_GRAD"], "gradient");
  EXPECT_EQ(cat["0F0"], "compute");
  EXPECT_EQ(cat.size(), 5u);  // UNSHARD, F, B, REDUCE_GRAD, RESHARD
  using Event = std::tuple<int, std::string, double, double>;
  EXPECT_THAT(CompleteOnThread(trace, 0)[4], Event(0, "0UNSHARD", 0, 0.25));
}

TEST(FormatChromeTrace, NamesOverlapsAfterTheContainer) {
  PipelineOrder lowered = {
      ParseActions({"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"}),
      ParseActions(
          {"1RECV_F0", "1F0", "1RECV_F1", "(1F1;1B0)OVERLAP_F_B", "1SEND_B0", "1B1", "1SEND_B1"})};
  json trace = ParseTrace(MustSimulate(lowered, {0, 1}, 2, 2));
  int found = 0;
  for (const json& e : EventsWithPhase(trace, "X")) {
    if (e["name"] != "(1F1;1B0)OVERLAP_F_B") continue;
    ++found;
    EXPECT_EQ(e["cat"], "compute");
    EXPECT_EQ(e["ts"], 2000);
    EXPECT_EQ(e["dur"], 3000);
    EXPECT_EQ(e["args"]["type"], "OVERLAP_F_B");
    EXPECT_EQ(e["args"]["sub_actions"], json({"1F1", "1B0"}));
  }
  EXPECT_EQ(found, 1);
}

// Complete events on one thread must not partially overlap (Perfetto needs them nested).
TEST(FormatChromeTrace, OverlappingTransfersGoToSeparateThreads) {
  CostModel costs;
  costs.latency = 3;  // many activations in flight at once
  Generated g = Generate(ScheduleKind::k1F1B, 4, 1, 8);
  Simulation sim = MustSimulate(g.lowered, g.stage_to_rank, g.num_stages, 8, costs);
  json trace = ParseTrace(sim);
  std::map<std::tuple<int, int>, std::vector<std::pair<double, double>>> spans;
  size_t transfers = 0;
  for (const json& e : EventsWithPhase(trace, "X")) {
    const double ts = e["ts"].get<double>();
    spans[{e["pid"].get<int>(), e["tid"].get<int>()}].emplace_back(ts, ts + e["dur"].get<double>());
    if (e["tid"] != 0) ++transfers;
  }
  EXPECT_EQ(transfers, 2 * sim.messages.size());
  bool more_than_one_lane = false;
  for (auto& [where, list] : spans) {
    if (std::get<1>(where) > 1) more_than_one_lane = true;
    std::sort(list.begin(), list.end());
    for (size_t i = 1; i < list.size(); ++i) {
      EXPECT_LE(list[i - 1].second, list[i].first)
          << "pid " << std::get<0>(where) << " tid " << std::get<1>(where);
    }
  }
  EXPECT_TRUE(more_than_one_lane);
  // Every extra lane is named.
  std::set<std::tuple<int, int>> named;
  for (const json& e : EventsWithPhase(trace, "M")) {
    if (e["name"] == "thread_name") named.insert({e["pid"].get<int>(), e["tid"].get<int>()});
  }
  for (const auto& [where, list] : spans) EXPECT_TRUE(named.count(where));
  // Flows still land on the threads holding their transfers.
  for (const json& e : EventsWithPhase(trace, "s")) {
    EXPECT_FALSE((spans[{e["pid"].get<int>(), e["tid"].get<int>()}].empty()));
  }
}

TEST(FormatChromeTrace, EmptyTimelineIsValid) {
  json trace = json::parse(FormatChromeTrace({}, {}));
  EXPECT_TRUE(trace["traceEvents"].is_array());
  EXPECT_TRUE(trace["traceEvents"].empty());
  EXPECT_EQ(trace["otherData"]["end"], 0);
}

}  // namespace
}  // namespace stagecoach::schedule::schedule_simulator_test
