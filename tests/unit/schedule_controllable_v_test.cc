// VHalf and VMin (common/schedule/generators/controllable_v.cc): for ranks 1..12 and
// microbatches 1..48 each list validates with the "v" mapping, lowers without deadlock, and —
// replayed by the memory model with one unit of activations per stage, kept until W — never holds
// more than its budget on any rank: 2*floor((p+2)/2) (VHalf) and 2*floor((p+4)/3) (VMin) stage
// activations, against ZBVZeroBubble's 2p. With enough microbatches VMin holds less than VHalf,
// which holds less than ZBVZeroBubble, and pays for it in bubbles (printed for the record).
#include <iostream>
#include <string>

#include "absl/strings/str_format.h"
#include "common/schedule/build.h"
#include "common/schedule/generators.h"
#include "common/schedule/memory_model.h"
#include "common/schedule/simulator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::schedule::schedule_controllable_v_test {
namespace {

int Budget(ScheduleKind kind, int p) {
  return kind == ScheduleKind::kVHalf ? 2 * ((p + 2) / 2) : 2 * ((p + 4) / 3);
}

struct Outcome {
  double peak = 0;    // the most stage activations any rank holds
  double bubble = 0;  // the largest bubble ratio, F = I = W = 1
};

Outcome RunKind(ScheduleKind kind, int p, int m) {
  auto built = BuildSchedule({kind, p, 2, m});
  EXPECT_TRUE(built.ok()) << ScheduleKindName(kind) << " p" << p << " m" << m << ": "
                          << built.status();
  if (!built.ok()) return {};
  auto sim = Simulate(built->lowered, built->stage_to_rank, 2 * p, m);
  EXPECT_TRUE(sim.ok()) << sim.status();
  if (!sim.ok()) return {};
  MemoryModel model;
  model.defaults.activations = 1;
  model.defaults.weight_activations = 1;  // W frees it all, as the budget counts
  auto memory = SimulateMemory(*sim, built->stage_to_rank, 2 * p, model);
  EXPECT_TRUE(memory.ok()) << memory.status();
  Outcome out;
  for (const RankMemory& r : memory->ranks) out.peak = std::max(out.peak, r.peak_dynamic);
  for (double b : sim->bubble_ratio) out.bubble = std::max(out.bubble, b);
  return out;
}

class ControllableV : public ::testing::TestWithParam<ScheduleKind> {};

TEST_P(ControllableV, ValidDeadlockFreeAndWithinBudget) {
  const ScheduleKind kind = GetParam();
  for (int p = 1; p <= 12; ++p) {
    for (int m = 1; m <= 48; ++m) {
      const Outcome out = RunKind(kind, p, m);
      ASSERT_FALSE(::testing::Test::HasFailure()) << "p" << p << " m" << m;
      ASSERT_LE(out.peak, Budget(kind, p)) << ScheduleKindName(kind) << " p" << p << " m" << m;
    }
  }
}

TEST_P(ControllableV, RefusesOtherStageCounts) {
  auto order = GenerateSchedule({GetParam(), 4, 1, 8});
  ASSERT_FALSE(order.ok());
  EXPECT_EQ(order.status().message(),
            absl::StrFormat("%s requires exactly 2 stages per rank, but got 1.",
                            ScheduleKindName(GetParam())));
}

INSTANTIATE_TEST_SUITE_P(Kinds, ControllableV,
                         ::testing::Values(ScheduleKind::kVHalf, ScheduleKind::kVMin),
                         [](const ::testing::TestParamInfo<ScheduleKind>& info) {
                           return std::string(ScheduleKindName(info.param));
                         });

TEST(ControllableV, LessMemoryThanZeroBubbleVForMoreBubbles) {
  std::cout << "   p   m  kind            peak/2p  bubble\n";
  for (int p : {4, 8}) {
    const int m = 4 * p;
    const Outcome zbv = RunKind(ScheduleKind::kZBVZeroBubble, p, m);
    const Outcome half = RunKind(ScheduleKind::kVHalf, p, m);
    const Outcome min = RunKind(ScheduleKind::kVMin, p, m);
    for (const auto& [name, out] :
         {std::pair<const char*, Outcome>{"ZBVZeroBubble", zbv}, {"VHalf", half}, {"VMin", min}}) {
      std::cout << absl::StrFormat("%4d %3d  %-14s %7.2f  %6.3f\n", p, m, name,
                                   out.peak / (2.0 * p), out.bubble);
    }
    EXPECT_GE(zbv.peak, 2 * p);
    EXPECT_LT(half.peak, zbv.peak) << "p" << p;
    EXPECT_LE(min.peak, half.peak) << "p" << p;
    EXPECT_LT(min.peak, zbv.peak) << "p" << p;
  }
  // p = 8: the budgets are 10 and 8 of ZB-V's 16.
  EXPECT_LE(RunKind(ScheduleKind::kVHalf, 8, 32).peak, 10);
  EXPECT_LE(RunKind(ScheduleKind::kVMin, 8, 32).peak, 8);
}

}  // namespace
}  // namespace stagecoach::schedule::schedule_controllable_v_test
