// Properties of every generator far outside the golden configurations: ranks 1-16, stages per
// rank 1-4, microbatches 1-64. Each configuration either gets PyTorch's constraint error (exactly
// when PyTorch raises) or a list that validates, lowers, validates lowered and simulates to the
// end without deadlock. Bubble ratios from the simulator match the closed forms.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/build.h"
#include "common/schedule/generators.h"
#include "common/schedule/lowering.h"
#include "common/schedule/simulator.h"
#include "common/schedule/validator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"

namespace stagecoach::schedule::schedule_sweep_test {
namespace {

using testing::ScheduleConfigFor;

// The error PyTorch raises for `c` (ours for its one-stage classes given several stages), or ""
// when it builds the schedule.
std::string ExpectedError(const ScheduleConfig& c) {
  const int m = c.num_microbatches;
  const int stages = NumStages(c);
  const int rounds = std::max(1, m / c.num_ranks);
  switch (c.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::k1F1B:
      if (c.stages_per_rank != 1) {
        return absl::StrCat(ScheduleKindName(c.kind),
                            " runs exactly one stage per rank, but stages_per_rank is ",
                            c.stages_per_rank);
      }
      if (c.kind == ScheduleKind::k1F1B && m < stages) {
        return absl::StrCat("Number of microbatches (", m,
                            ") must be greater than or equal to the number of stages (", stages,
                            ").");
      }
      return "";
    case ScheduleKind::kInterleaved1F1B:
      if (m % rounds != 0) {
        return absl::StrCat(
            "Interleaved 1F1B requires the number of microbatches to be a multiple of the "
            "number of rounds (",
            rounds, "), but got ", m, ".");
      }
      return "";
    case ScheduleKind::kInterleavedZeroBubble:
      if (m % rounds != 0) {
        return absl::StrCat(
            "Zero bubble requires the number of microbatches to be a multiple of the number of "
            "rounds (",
            rounds, "), but got ", m, ".");
      }
      return "";
    case ScheduleKind::kZBVZeroBubble:
    case ScheduleKind::kDualPipeV:
      if (c.stages_per_rank != 2) {
        return absl::StrCat("ZBV requires exactly 2 stages per rank, but got ", c.stages_per_rank,
                            ".");
      }
      if (c.kind == ScheduleKind::kDualPipeV && m < stages) {
        return absl::StrCat("DualPipeV requires at least as many microbatches as stages, but got ",
                            m, " microbatches and ", stages, " stages.");
      }
      return "";
    case ScheduleKind::kVHalf:
    case ScheduleKind::kVMin:
      if (c.stages_per_rank != 2) {
        return absl::StrCat(ScheduleKindName(c.kind),
                            " requires exactly 2 stages per rank, but got ", c.stages_per_rank,
                            ".");
      }
      return "";
    case ScheduleKind::kLoopedBFS:
    case ScheduleKind::kForwardOnly:
      return "";
  }
  return "?";
}

class Sweep : public ::testing::TestWithParam<ScheduleKind> {};

TEST_P(Sweep, ConstraintErrorOrValidLowerableSimulatableList) {
  const ScheduleKind kind = GetParam();
  int built = 0, refused = 0;
  for (int ranks = 1; ranks <= 16; ++ranks) {
    for (int spr = 1; spr <= 4; ++spr) {
      for (int m = 1; m <= 64; ++m) {
        const ScheduleConfig config = ScheduleConfigFor(kind, ranks, spr, m);
        const std::string expected = ExpectedError(config);
        auto order = GenerateSchedule(config);
        if (!expected.empty()) {
          ASSERT_FALSE(order.ok()) << "r" << ranks << " s" << spr << " m" << m;
          ASSERT_EQ(order.status().code(), absl::StatusCode::kInvalidArgument);
          ASSERT_EQ(order.status().message(), expected);
          ++refused;
          continue;
        }
        const std::string where = absl::StrCat("r", ranks, " s", spr, " m", m);
        ASSERT_TRUE(order.ok()) << where << ": " << order.status();
        const int stages = NumStages(config);
        ValidationOptions validation;
        validation.has_backward = HasBackward(kind);
        auto mapping = ValidateComputeSchedule(*order, ranks, stages, m, validation);
        ASSERT_TRUE(mapping.ok()) << where << ": " << mapping.status();
        ASSERT_EQ(*mapping, *StageToRank(stages, ranks, DefaultMappingStyle(kind))) << where;
        auto lowered = LowerSchedule(*order, *mapping, stages, m);
        ASSERT_TRUE(lowered.ok()) << where << ": " << lowered.status();
        absl::Status valid = ValidateLoweredSchedule(*lowered, *mapping, stages, m, validation);
        ASSERT_TRUE(valid.ok()) << where << ": " << valid;
        auto sim = Simulate(*lowered, *mapping, stages, m);
        ASSERT_TRUE(sim.ok()) << where << ": " << sim.status();
        ASSERT_GT(sim->makespan, 0) << where;
        ++built;
      }
    }
  }
  EXPECT_EQ(built + refused, 16 * 4 * 64);
  EXPECT_GT(built, 0);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, Sweep, ::testing::ValuesIn(AllScheduleKinds()),
                         [](const ::testing::TestParamInfo<ScheduleKind>& info) {
                           return "k" + std::string(ScheduleKindName(info.param));
                         });

CostModel EqualForwardBackward() {
  CostModel costs;
  costs.defaults.forward = 1;
  costs.defaults.backward = 1;
  return costs;
}

absl::StatusOr<Simulation> SimulateGenerated(const ScheduleConfig& config, const CostModel& costs) {
  auto built = BuildSchedule(config);
  if (!built.ok()) return built.status();
  return Simulate(built->lowered, built->stage_to_rank, NumStages(config), config.num_microbatches,
                  costs);
}

// With F = B, GPipe and 1F1B both idle (p-1)/(m+p-1) of the step on every rank.
TEST(SweepBubbles, GPipeAndOneFOneBMatchTheClosedForm) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int p = 1; p <= 16; ++p) {
      for (int m = p; m <= 64; ++m) {
        auto sim = SimulateGenerated(ScheduleConfigFor(kind, p, 1, m), EqualForwardBackward());
        ASSERT_TRUE(sim.ok()) << sim.status();
        const double expected = static_cast<double>(p - 1) / (m + p - 1);
        for (int r = 0; r < p; ++r) {
          ASSERT_NEAR(sim->bubble_ratio[r], expected, 1e-9)
              << ScheduleKindName(kind) << " p" << p << " m" << m << " rank " << r;
        }
      }
    }
  }
}

// ZBV with F = I = W (B = I + W) idles less than 1F1B with the same costs per stage, for the same
// ranks and microbatches, on its worst rank and on average.
TEST(SweepBubbles, ZeroBubbleVBeatsOneFOneB) {
  CostModel costs;
  costs.defaults = {1, 2, 1, 1};
  for (int p = 2; p <= 16; ++p) {
    for (int m = p; m <= 64; ++m) {
      auto zbv = SimulateGenerated(ScheduleConfigFor(ScheduleKind::kZBVZeroBubble, p, 2, m), costs);
      auto one_f_one_b = SimulateGenerated(ScheduleConfigFor(ScheduleKind::k1F1B, p, 1, m), costs);
      ASSERT_TRUE(zbv.ok() && one_f_one_b.ok());
      auto worst = [](const Simulation& s) {
        return *std::max_element(s.bubble_ratio.begin(), s.bubble_ratio.end());
      };
      auto mean = [](const Simulation& s) {
        double sum = 0;
        for (double b : s.bubble_ratio) sum += b;
        return sum / s.bubble_ratio.size();
      };
      ASSERT_LT(worst(*zbv), worst(*one_f_one_b)) << "p" << p << " m" << m;
      ASSERT_LT(mean(*zbv), mean(*one_f_one_b)) << "p" << p << " m" << m;
    }
  }
}

}  // namespace
}  // namespace stagecoach::schedule::schedule_sweep_test
