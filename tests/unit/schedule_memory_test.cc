// The schedule memory model (common/schedule/memory_model.h): peaks worked out by hand on small
// schedules (GPipe holds every microbatch, 1F1B's rank r holds p - r, a split backward holds W's
// part between I and W, ZB-V holds what 1F1B holds), receive and send buffers, the curve, and
// errors.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/action.h"
#include "common/schedule/build.h"
#include "common/schedule/generators.h"
#include "common/schedule/memory_model.h"
#include "common/schedule/simulator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"

namespace stagecoach::schedule::schedule_memory_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ParseActions;

struct Replay {
  Simulation sim;
  MemoryProfile memory;
};

Replay MustRun(const PipelineOrder& lowered, const std::vector<int>& stage_to_rank, int num_stages,
               int num_microbatches, const MemoryModel& model, const CostModel& costs = {}) {
  Replay run;
  auto sim = Simulate(lowered, stage_to_rank, num_stages, num_microbatches, costs);
  EXPECT_TRUE(sim.ok()) << sim.status();
  if (!sim.ok()) return run;
  run.sim = *std::move(sim);
  auto memory = SimulateMemory(run.sim, stage_to_rank, num_stages, model);
  EXPECT_TRUE(memory.ok()) << memory.status();
  if (memory.ok()) run.memory = *std::move(memory);
  return run;
}

Replay MustRunKind(ScheduleKind kind, int ranks, int microbatches, const MemoryModel& model,
                   const CostModel& costs = {}) {
  ScheduleConfig config{kind, ranks, DefaultStagesPerRank(kind), microbatches};
  auto built = BuildSchedule(config);
  EXPECT_TRUE(built.ok()) << built.status();
  if (!built.ok()) return {};
  return MustRun(built->lowered, built->stage_to_rank, NumStages(config), microbatches, model,
                 costs);
}

MemoryModel Activations(double bytes) {
  MemoryModel model;
  model.defaults.activations = bytes;
  return model;
}

std::vector<double> Peaks(const MemoryProfile& profile) {
  std::vector<double> peaks;
  for (const RankMemory& r : profile.ranks) peaks.push_back(r.peak_dynamic);
  return peaks;
}

std::vector<std::pair<double, double>> Curve(const RankMemory& rank) {
  std::vector<std::pair<double, double>> out;
  for (const MemoryPoint& p : rank.curve) out.emplace_back(p.time, p.bytes);
  return out;
}

using Points = std::vector<std::pair<double, double>>;

TEST(ScheduleMemoryTest, GPipeHoldsEveryMicrobatch) {
  Replay run = MustRunKind(ScheduleKind::kGPipe, 4, 8, Activations(100));
  EXPECT_THAT(Peaks(run.memory), ElementsAre(800, 800, 800, 800));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(run.memory.ranks[r].peak_microbatches, 8);
    EXPECT_EQ(run.memory.ranks[r].peak_action, absl::StrCat(r, "F7"));
  }
}

TEST(ScheduleMemoryTest, OneFOneBRankHoldsTheStagesFromItToTheEnd) {
  // Rank r runs p - r forwards before its first backward.
  Replay run = MustRunKind(ScheduleKind::k1F1B, 4, 8, Activations(100));
  EXPECT_THAT(Peaks(run.memory), ElementsAre(400, 300, 200, 100));
  EXPECT_EQ(run.memory.ranks[0].peak_action, "0F3");
  EXPECT_EQ(run.memory.ranks[0].peak_microbatches, 4);
  // More microbatches add no memory (GPipe's grows with them).
  EXPECT_THAT(Peaks(MustRunKind(ScheduleKind::k1F1B, 4, 32, Activations(100)).memory),
              ElementsAre(400, 300, 200, 100));
}

TEST(ScheduleMemoryTest, InterleavedHoldsMegatronsWarmUpPlusOne) {
  // Megatron's interleaved warm-up on rank r: (p - r - 1) * 2 + (v - 1) * p forwards, then one
  // more before the first backward; each is one stage's (a chunk's) activations.
  const int p = 4, v = 2;
  Replay run = MustRunKind(ScheduleKind::kInterleaved1F1B, p, 8, Activations(100));
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(run.memory.ranks[r].peak_dynamic, 100 * ((p - r - 1) * 2 + (v - 1) * p + 1))
        << "rank " << r;
  }
}

TEST(ScheduleMemoryTest, ZeroBubbleVHoldsWhatOneFOneBsFirstRankHolds) {
  // ZB-V's claim: the peak of 1F1B's first rank (p microbatches of a rank's layers, here 2p
  // stages of 100 bytes) on every rank, when W needs nothing that I frees.
  for (int p : {2, 4}) {
    Replay run = MustRunKind(ScheduleKind::kZBVZeroBubble, p, 2 * p, Activations(100));
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(run.memory.ranks[r].peak_dynamic, 2 * p * 100) << "p " << p << " rank " << r;
    }
  }
}

TEST(ScheduleMemoryTest, ControllableVSchedulesHoldTheirShareOfOneFOneB) {
  // A rank's layers keep 200 bytes per microbatch: 1F1B's first rank holds p of them, the V
  // schedules' ranks two stages of 100 each. VHalf's budget is (p+2)/2 microbatches and VMin's
  // (p+4)/3, so their share of 1F1B's peak falls toward the paper's 1/2 and 1/3 as p grows:
  // 0.75 and 0.5 at p = 4, 0.5625 and 0.375 at p = 16.
  struct Row {
    int p;
    double v_half;
    double v_min;
  };
  for (const Row& row : {Row{4, 0.75, 0.5}, Row{8, 0.625, 0.5}, Row{16, 0.5625, 0.375}}) {
    const int m = 2 * row.p;
    MemoryModel one_stage = Activations(200);
    MemoryModel two_stages = Activations(100);
    const double one_f_one_b =
        MustRunKind(ScheduleKind::k1F1B, row.p, m, one_stage).memory.ranks[0].peak_dynamic;
    ASSERT_EQ(one_f_one_b, 200.0 * row.p);
    for (const auto& [kind, share] :
         {std::pair{ScheduleKind::kVHalf, row.v_half}, std::pair{ScheduleKind::kVMin, row.v_min}}) {
      Replay run = MustRunKind(kind, row.p, m, two_stages);
      double largest = 0;
      for (const RankMemory& rank : run.memory.ranks)
        largest = std::max(largest, rank.peak_dynamic);
      EXPECT_LE(largest / one_f_one_b, share) << ScheduleKindName(kind) << " p " << row.p;
    }
  }
}

TEST(ScheduleMemoryTest, SplitBackwardKeepsWeightPartUntilW) {
  // One rank, two stages, two microbatches; every action costs 1. Stage 0 holds nothing, so
  // that the curve is stage 1's; stage 1 keeps 100 per microbatch, of which W needs 40.
  MemoryModel model = Activations(100);
  model.defaults.weight_activations = 40;
  model.per_stage = {StageMemory{}};
  const std::vector<int> one_rank{0, 0};
  // Both of stage 1's forwards first: 200 from 1F1 (at 3); each I leaves 40, each W frees it.
  Replay all_first = MustRun({ParseActions({"0F0", "1F0", "0F1", "1F1", "1I0", "1I1", "1W0", "1W1",
                                            "0I0", "0I1", "0W0", "0W1"})},
                             one_rank, 2, 2, model);
  const RankMemory& a = all_first.memory.ranks[0];
  EXPECT_EQ(a.peak_dynamic, 200);
  EXPECT_EQ(a.peak_action, "1F1");
  EXPECT_EQ(a.peak_time, 3);
  EXPECT_THAT(Curve(a),
              ElementsAre(std::pair(0.0, 0.0), std::pair(1.0, 100.0), std::pair(3.0, 200.0),
                          std::pair(5.0, 140.0), std::pair(6.0, 80.0), std::pair(7.0, 40.0),
                          std::pair(8.0, 0.0)));
  // I before the next F: 1F1 runs on 1W0's 40 bytes, 140, with both microbatches of both
  // stages held (stage 0's of no bytes).
  Replay interleaved = MustRun({ParseActions({"0F0", "1F0", "1I0", "0F1", "1F1", "1I1", "1W0",
                                              "1W1", "0I0", "0I1", "0W0", "0W1"})},
                               one_rank, 2, 2, model);
  EXPECT_EQ(interleaved.memory.ranks[0].peak_dynamic, 140);
  EXPECT_EQ(interleaved.memory.ranks[0].peak_microbatches, 4);
  EXPECT_EQ(interleaved.memory.ranks[0].peak_time, 4);
  // The full backward frees everything at once: 100.
  Replay full = MustRun({ParseActions({"0F0", "1F0", "1B0", "0F1", "1F1", "1B1", "0B0", "0B1"})},
                        one_rank, 2, 2, model);
  EXPECT_EQ(full.memory.ranks[0].peak_dynamic, 100);
}

TEST(ScheduleMemoryTest, SplitBackwardBuildsUpWhatWNeedsWhileIRuns) {
  // Stage 1 of two on one rank: I runs with its transient less W's (30 - 10) and builds up the
  // 25 bytes of weight gradients; W runs with its 10 and frees them.
  MemoryModel model = Activations(100);
  model.defaults.weight_activations = 40;
  model.defaults.weight_gradients = 25;
  model.defaults.backward_transient = 30;
  model.defaults.weight_transient = 10;
  model.per_stage = {StageMemory{}};
  Replay run =
      MustRun({ParseActions({"0F0", "1F0", "1I0", "1W0", "0I0", "0W0"})}, {0, 0}, 2, 1, model);
  // 1I0 [2,3]: 100 + 20 + 25 = 145, then 40 + 25 = 65; 1W0 [3,4]: 75, then 0.
  EXPECT_EQ(run.memory.ranks[0].peak_dynamic, 145);
  EXPECT_EQ(run.memory.ranks[0].peak_action, "1I0");
  EXPECT_THAT(Curve(run.memory.ranks[0]),
              ElementsAre(std::pair(0.0, 0.0), std::pair(1.0, 100.0), std::pair(2.0, 145.0),
                          std::pair(3.0, 75.0), std::pair(4.0, 0.0)));
}

TEST(ScheduleMemoryTest, TheFirstStagesIDoesNothingAndItsWIsTheWholeBackward) {
  // Stage 0's input is the data: its I has no input path. Two microbatches on one stage:
  // every F's 100 stays through its I, and W runs with the backward's transient (50), not
  // W's (10), and frees everything.
  MemoryModel model = Activations(100);
  model.defaults.weight_activations = 40;
  model.defaults.weight_gradients = 25;
  model.defaults.backward_transient = 50;
  model.defaults.weight_transient = 10;
  Replay run =
      MustRun({ParseActions({"0F0", "0I0", "0F1", "0I1", "0W0", "0W1"})}, {0}, 1, 2, model);
  const RankMemory& m = run.memory.ranks[0];
  EXPECT_EQ(m.peak_dynamic, 250);
  EXPECT_EQ(m.peak_action, "0W0");
  EXPECT_THAT(Curve(m),
              ElementsAre(std::pair(0.0, 100.0), std::pair(2.0, 200.0), std::pair(4.0, 250.0),
                          std::pair(5.0, 150.0), std::pair(6.0, 0.0)));
}

TEST(ScheduleMemoryTest, BackwardTransientAddsWhileTheBackwardRuns) {
  MemoryModel model = Activations(100);
  model.defaults.backward_transient = 50;
  Replay run = MustRun({ParseActions({"0F0", "0F1", "0B0", "0B1"})}, {0}, 1, 2, model);
  const RankMemory& m = run.memory.ranks[0];
  EXPECT_EQ(m.peak_dynamic, 250);
  EXPECT_EQ(m.peak_action, "0B0");
  EXPECT_EQ(m.peak_time, 2);
  EXPECT_EQ(m.peak_microbatches, 2);
  // 250 while 0B0 runs; at 4 it ends (100) and 0B1 starts (150); 0 at the end.
  EXPECT_THAT(Curve(m),
              ElementsAre(std::pair(0.0, 100.0), std::pair(1.0, 200.0), std::pair(2.0, 250.0),
                          std::pair(4.0, 150.0), std::pair(6.0, 0.0)));
}

TEST(ScheduleMemoryTest, ForwardTransientAddsWhileTheForwardRuns) {
  MemoryModel model = Activations(100);
  model.defaults.forward_transient = 30;
  Replay run = MustRun({ParseActions({"0F0", "0F1", "0B0", "0B1"})}, {0}, 1, 2, model);
  const RankMemory& m = run.memory.ranks[0];
  EXPECT_EQ(m.peak_dynamic, 230);
  EXPECT_EQ(m.peak_action, "0F1");
  EXPECT_THAT(Curve(m),
              ElementsAre(std::pair(0.0, 130.0), std::pair(1.0, 230.0), std::pair(2.0, 200.0),
                          std::pair(4.0, 100.0), std::pair(6.0, 0.0)));
}

TEST(ScheduleMemoryTest, ReceiveAndSendBuffersAcrossRanks) {
  // GPipe on 2 ranks, one microbatch; F 1, B 2, every message 1. Activations 100, outputs 10.
  //  rank 0: 0F0 [0,1] 100; 0RECV_B0 at 1 +10 = 110; waits for the gradient (arrives 6);
  //          0B0 [6,8] allocates the stage's gradients (1000) as it frees its activations:
  //          110 + 900 = 1010 while it runs; then frees the received gradient: 1000.
  //  rank 1: 1RECV_F0 at 0 +10; 1F0 [2,3] 110; 1B0 [3,5] builds the input gradient (10) and
  //          the gradients: 1020; at 5 frees activations and its input: 1010 left, the gradient
  //          being sent (5 -> 6), then 1000.
  // Static: parameters and AdamW's two moments, 3000; the peak total is 4010 on rank 0.
  MemoryModel model = Activations(100);
  model.defaults.output = 10;
  model.defaults.parameters = 1000;
  model.defaults.gradients = 1000;
  model.defaults.optimizer_state = OptimizerStateBytes(OptimizerKind::kAdamW, 1000);
  CostModel costs;
  costs.latency = 1;
  Replay run = MustRun({ParseActions({"0F0", "0SEND_F0", "0RECV_B0", "0B0"}),
                        ParseActions({"1RECV_F0", "1F0", "1B0", "1SEND_B0"})},
                       {0, 1}, 2, 1, model, costs);
  const RankMemory& r0 = run.memory.ranks[0];
  const RankMemory& r1 = run.memory.ranks[1];
  EXPECT_EQ(r0.static_bytes, 3000);
  EXPECT_EQ(r0.peak_dynamic, 1010);
  EXPECT_EQ(r0.peak_total, 4010);
  EXPECT_EQ(r0.peak_action, "0B0");
  EXPECT_THAT(Curve(r0), ElementsAre(std::pair(0.0, 100.0), std::pair(1.0, 110.0),
                                     std::pair(6.0, 1010.0), std::pair(8.0, 1000.0)));
  EXPECT_EQ(r1.peak_dynamic, 1020);
  EXPECT_EQ(r1.peak_action, "1B0");
  EXPECT_EQ(r1.peak_time, 3);
  EXPECT_THAT(Curve(r1),
              ElementsAre(std::pair(0.0, 10.0), std::pair(2.0, 110.0), std::pair(3.0, 1020.0),
                          std::pair(5.0, 1010.0), std::pair(6.0, 1000.0)));
}

TEST(ScheduleMemoryTest, SplitBackwardKeepsTheReceivedInputUntilW) {
  // Rank 1 runs the last stage with a split backward: its received input (10) stays with W.
  //  1RECV_F0 at 0: 10; 1F0 [1,2]: 110; 1I0 [2,3] builds the input gradient: 120, then frees
  //  60 of the activations: 60; the gradient arrives at 3: 50; 1W0 [3,4] frees the rest: 0.
  MemoryModel model = Activations(100);
  model.defaults.weight_activations = 40;
  model.defaults.output = 10;
  const PipelineOrder lowered = {ParseActions({"0F0", "0SEND_F0", "0RECV_B0", "0B0"}),
                                 ParseActions({"1RECV_F0", "1F0", "1I0", "1SEND_B0", "1W0"})};
  Replay run = MustRun(lowered, {0, 1}, 2, 1, model);
  const RankMemory& m = run.memory.ranks[1];
  EXPECT_EQ(m.peak_dynamic, 120);
  EXPECT_EQ(m.peak_action, "1I0");
  EXPECT_THAT(Curve(m),
              ElementsAre(std::pair(0.0, 10.0), std::pair(1.0, 110.0), std::pair(2.0, 120.0),
                          std::pair(3.0, 50.0), std::pair(4.0, 0.0)));
  // A runtime that keeps gradient sends to the end of the step: 60 until 4.
  model.gradient_sends_held_to_step_end = true;
  Replay held = MustRun(lowered, {0, 1}, 2, 1, model);
  EXPECT_THAT(Curve(held.memory.ranks[1]),
              ElementsAre(std::pair(0.0, 10.0), std::pair(1.0, 110.0), std::pair(2.0, 120.0),
                          std::pair(3.0, 60.0), std::pair(4.0, 0.0)));
}

TEST(ScheduleMemoryTest, GradientSendsHeldToStepEndGrowWithMicrobatches) {
  // 1F1B's last rank holds one microbatch's activations, but a runtime that keeps every
  // gradient send to the end of the step holds m input gradients by then.
  MemoryModel model = Activations(100);
  model.defaults.output = 10;
  model.gradient_sends_held_to_step_end = true;
  Replay run = MustRunKind(ScheduleKind::k1F1B, 2, 8, model);
  // During its last B: 8 gradients (7 sent, the 8th being built), its input and activations.
  EXPECT_EQ(run.memory.ranks[1].peak_dynamic, 8 * 10 + 10 + 100);
  model.gradient_sends_held_to_step_end = false;
  EXPECT_EQ(MustRunKind(ScheduleKind::k1F1B, 2, 8, model).memory.ranks[1].peak_dynamic,
            10 + 10 + 100 + 10);
}

TEST(ScheduleMemoryTest, GradientHandedToAStageOnTheSameRank) {
  // Stages 0 and 1 on one rank: no buffers; 1B0 hands stage 0 its 10-byte gradient, which 0B0
  // consumes.
  MemoryModel model = Activations(100);
  model.defaults.output = 10;
  Replay run = MustRun({ParseActions({"0F0", "1F0", "1B0", "0B0"})}, {0, 0}, 2, 1, model);
  const RankMemory& m = run.memory.ranks[0];
  EXPECT_EQ(m.peak_dynamic, 210);
  EXPECT_EQ(m.peak_action, "1B0");
  EXPECT_EQ(m.peak_microbatches, 2);
  EXPECT_THAT(Curve(m),
              ElementsAre(std::pair(0.0, 100.0), std::pair(1.0, 200.0), std::pair(2.0, 210.0),
                          std::pair(4.0, 110.0), std::pair(6.0, 0.0)));
}

TEST(ScheduleMemoryTest, OverlappedPairPeaksOnWhatItsFirstHalfLeft) {
  // (0F1;0B0): F1 builds 100 on top of F0's 100, then B0 frees 100: 200 at its start.
  Replay run =
      MustRun({ParseActions({"0F0", "(0F1;0B0)OVERLAP_F_B", "0B1"})}, {0}, 1, 2, Activations(100));
  const RankMemory& m = run.memory.ranks[0];
  EXPECT_EQ(m.peak_dynamic, 200);
  EXPECT_EQ(m.peak_action, "(0F1;0B0)OVERLAP_F_B");
  EXPECT_EQ(m.peak_microbatches, 2);
  EXPECT_THAT(Curve(m), ElementsAre(std::pair(0.0, 100.0), std::pair(1.0, 200.0),
                                    std::pair(4.0, 100.0), std::pair(6.0, 0.0)));
}

TEST(ScheduleMemoryTest, StaticBytesSumTheRanksStages) {
  MemoryModel model;
  model.defaults.parameters = 10;
  model.per_stage = {StageMemory{1000, 1000, 2000}};  // stage 0 (rank 0) is bigger
  Replay run = MustRunKind(ScheduleKind::kZBVZeroBubble, 2, 4, model);
  // ZB-V puts stages 0 and 3 on rank 0, 1 and 2 on rank 1. Static: parameters and optimizer
  // state; stage 0's gradients are dynamic, from its first W.
  EXPECT_EQ(run.memory.ranks[0].static_bytes, 3000 + 10);
  EXPECT_EQ(run.memory.ranks[1].static_bytes, 20);
  EXPECT_EQ(run.memory.ranks[0].peak_dynamic, 1000);
  EXPECT_EQ(run.memory.ranks[0].peak_action, "0W0");
  EXPECT_EQ(run.memory.ranks[0].peak_total, 4010);
  EXPECT_EQ(run.memory.ranks[1].peak_dynamic, 0);
}

TEST(ScheduleMemoryTest, GradientsComeWithEachStagesFirstBackwardAndStayToTheStepsEnd) {
  // Stages 0 and 1 on one rank, two microbatches; F 1, B 2. Activations 100, gradients 150 and
  // 170. 1B0 [4,6] allocates stage 1's gradients as it frees its microbatch's activations:
  // 400 + (170 - 100) while it runs and after; 1B1 adds none (370 at 8); 0B0 [8,10] allocates
  // stage 0's: 370 + 50 while it runs and after; 320 at the end.
  MemoryModel model = Activations(100);
  model.per_stage = {StageMemory{}, StageMemory{}};
  model.per_stage[0].activations = model.per_stage[1].activations = 100;
  model.per_stage[0].gradients = 150;
  model.per_stage[1].gradients = 170;
  Replay run = MustRun({ParseActions({"0F0", "0F1", "1F0", "1F1", "1B0", "1B1", "0B0", "0B1"})},
                       {0, 0}, 2, 2, model);
  const RankMemory& m = run.memory.ranks[0];
  EXPECT_EQ(m.static_bytes, 0);
  EXPECT_EQ(m.peak_dynamic, 470);
  EXPECT_EQ(m.peak_action, "1B0");
  EXPECT_THAT(Curve(m),
              ElementsAre(std::pair(0.0, 100.0), std::pair(1.0, 200.0), std::pair(2.0, 300.0),
                          std::pair(3.0, 400.0), std::pair(4.0, 470.0), std::pair(8.0, 420.0),
                          std::pair(12.0, 320.0)));

  // Gradients smaller than the activations a backward frees add nothing while it runs: the
  // peak is the last forward's.
  model.per_stage[0].gradients = 50;
  model.per_stage[1].gradients = 70;
  Replay smaller = MustRun({ParseActions({"0F0", "0F1", "1F0", "1F1", "1B0", "1B1", "0B0", "0B1"})},
                           {0, 0}, 2, 2, model);
  EXPECT_EQ(smaller.memory.ranks[0].peak_dynamic, 400);
  EXPECT_EQ(smaller.memory.ranks[0].peak_action, "1F1");
  EXPECT_THAT(Curve(smaller.memory.ranks[0]),
              ElementsAre(std::pair(0.0, 100.0), std::pair(1.0, 200.0), std::pair(2.0, 300.0),
                          std::pair(3.0, 400.0), std::pair(6.0, 370.0), std::pair(8.0, 270.0),
                          std::pair(10.0, 220.0), std::pair(12.0, 120.0)));
}

TEST(ScheduleMemoryTest, SplitBackwardAllocatesTheGradientsAtW) {
  // One stage, one microbatch: 0F0 [0,1] 100; 0I0 [1,2] keeps 60 for W; 0W0 [2,3] allocates
  // the gradients (150) as it frees those 60: 150 while it runs and after (I and W cost 1).
  MemoryModel model = Activations(100);
  model.defaults.weight_activations = 60;
  model.defaults.gradients = 150;
  Replay run = MustRun({ParseActions({"0F0", "0I0", "0W0"})}, {0}, 1, 1, model);
  const RankMemory& m = run.memory.ranks[0];
  EXPECT_EQ(m.peak_dynamic, 150);
  EXPECT_EQ(m.peak_action, "0W0");
  // 60 at 2 (I's end) and 150 at 2 (W's start): the curve keeps the last.
  EXPECT_THAT(Curve(m), ElementsAre(std::pair(0.0, 100.0), std::pair(2.0, 150.0)));
}

TEST(ScheduleMemoryTest, ShardedParametersAreWholeFromUnshardToReshard) {
  // One stage: 0UNSHARD gathers 300 at 0; 0F0 [0,1] keeps 100 (peak 400); 0B0 [1,3] frees them
  // and allocates 40 of gradients; freed at 0REDUCE_GRAD (3) when sharded, and the gathered
  // parameters at 0RESHARD (3).
  MemoryModel model = Activations(100);
  model.defaults.parameters = 20;
  model.defaults.gradients = 40;
  model.defaults.gathered_parameters = 300;
  model.defaults.gradients_freed_at_reduce = true;
  const PipelineOrder lowered = {
      ParseActions({"0UNSHARD", "0F0", "0B0", "0REDUCE_GRAD", "0RESHARD"})};
  Replay run = MustRun(lowered, {0}, 1, 1, model);
  const RankMemory& m = run.memory.ranks[0];
  EXPECT_EQ(m.static_bytes, 20);
  EXPECT_EQ(m.peak_dynamic, 400);
  EXPECT_EQ(m.peak_action, "0F0");
  EXPECT_THAT(Curve(m), ElementsAre(std::pair(0.0, 400.0), std::pair(3.0, 0.0)));
  // Gradients kept to the step's end (unsharded gradients): 40 after the step.
  model.defaults.gradients_freed_at_reduce = false;
  EXPECT_THAT(Curve(MustRun(lowered, {0}, 1, 1, model).memory.ranks[0]),
              ElementsAre(std::pair(0.0, 400.0), std::pair(3.0, 40.0)));
  model.defaults.gathered_parameters = -1;
  auto bad = SimulateMemory(run.sim, {0}, 1, model);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("memory.defaults.gathered_parameters must be finite and >= 0"));
}

TEST(ScheduleMemoryTest, OptimizerState) {
  EXPECT_EQ(OptimizerStateBytes(OptimizerKind::kSgd, 1000), 0);
  EXPECT_EQ(OptimizerStateBytes(OptimizerKind::kSgdMomentum, 1000), 1000);
  EXPECT_EQ(OptimizerStateBytes(OptimizerKind::kAdamW, 1000), 2000);
  EXPECT_EQ(OptimizerStateBytes(OptimizerKind::kAdamW, 1000, 3), 667);  // each shard rounded up
}

TEST(ScheduleMemoryTest, BadModelsAreNamed) {
  Replay run = MustRunKind(ScheduleKind::k1F1B, 2, 2, {});
  auto check = [&](const MemoryModel& model, int num_stages, const std::string& want) {
    std::vector<int> map(num_stages, 0);
    if (num_stages == 2) map = {0, 1};
    auto memory = SimulateMemory(run.sim, map, num_stages, model);
    ASSERT_FALSE(memory.ok()) << want;
    EXPECT_EQ(memory.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(memory.status().message()), HasSubstr(want));
  };
  MemoryModel negative;
  negative.per_stage.resize(2);
  negative.per_stage[1].activations = -1;
  check(negative, 2, "memory.per_stage[1].activations must be finite and >= 0, got -1");
  MemoryModel nan;
  nan.defaults.output = std::numeric_limits<double>::quiet_NaN();
  check(nan, 2, "memory.defaults.output must be finite");
  MemoryModel weight = Activations(10);
  weight.defaults.weight_activations = 11;
  check(weight, 2, "memory.defaults.weight_activations (11) is more than its activations (10)");
  MemoryModel long_list;
  long_list.per_stage.resize(3);
  check(long_list, 2, "memory.per_stage has 3 entries for 2 stages");
  check({}, 1, "names a stage outside [0, 1)");
}

TEST(ScheduleMemoryTest, FormatMemory) {
  MemoryModel model = Activations(3 << 20);
  model.defaults.parameters = 1 << 30;
  const std::string text = FormatMemory(MustRunKind(ScheduleKind::k1F1B, 2, 4, model).memory);
  EXPECT_THAT(text, HasSubstr("peak total"));
  EXPECT_THAT(text, HasSubstr("1.0 GiB"));
  EXPECT_THAT(text, HasSubstr("6.0 MiB"));
  EXPECT_THAT(text, HasSubstr("0F1"));
}

}  // namespace
}  // namespace stagecoach::schedule::schedule_memory_test
